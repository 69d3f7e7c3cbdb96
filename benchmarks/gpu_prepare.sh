#!/usr/bin/env bash
# Run HERE (with network) before lending a GPU machine: puts into .gpu_assets/ (git-ignored,
# carried to the device with `carry: [".gpu_assets"]`) the pure-Python wheels the device image
# lacks, a model skeleton (config + tokenizer of the embedded SmolLM2-135M, no weights) and the
# GSM8K files (the loop part's prompts).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-/work/main/.venv/bin/python}
mkdir -p .gpu_assets/wheels .gpu_assets/skeleton
# the versions this project runs with here (pydantic pins pydantic-core exactly); sympy and mpmath
# come with torch in the device image
pin() { "$PY" -c "import importlib.metadata as m; print('$1==' + m.version('$1'))"; }
"$PY" -m pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: -d .gpu_assets/wheels \
  "$(pin pydantic)" "$(pin typing-extensions)" "$(pin annotated-types)" "$(pin typing-inspection)" \
  "$(pin gguf)" "$(pin math-verify)" "$(pin latex2sympy2_extended)" "$(pin antlr4-python3-runtime)"
"$PY" -m pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 -d .gpu_assets/wheels "$(pin pydantic-core)"
src=$(PYTHONPATH=$PWD "$PY" -c "from upslope.models import resolve_model; print(resolve_model('smollm2-135m-instruct'))" | tail -1)
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$src/$f" ] && cp "$src/$f" .gpu_assets/skeleton/
done
data=$(PYTHONPATH=$PWD "$PY" -c "from upslope.data.paths import shared_data_dir; print(shared_data_dir())" | tail -1)
mkdir -p .gpu_assets/data/gsm8k
cp "$data/gsm8k/test.jsonl" "$data/gsm8k/train.jsonl" .gpu_assets/data/gsm8k/
du -sh .gpu_assets
