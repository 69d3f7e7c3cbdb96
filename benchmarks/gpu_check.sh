#!/usr/bin/env bash
# One prepared check for a lent GPU machine (no network; < 8 minutes): install the carried wheels,
# run the gpu tests, then benchmarks/gpu_check.py (learner MFU table on random-init 0.5B and 1.7B
# shapes, HF engine tokens/s, a few loop steps with the step split, 2-rank DDP if 2+ GPUs).
# Results: $OUT/gpu_check.json and $OUT/pytest_gpu.txt.
#   device:  bash benchmarks/gpu_check.sh            (after benchmarks/gpu_prepare.sh here; carry .gpu_assets)
#   here:    bash benchmarks/gpu_check.sh --cpu-dry-run   (tiny shapes on the CPU: proves the script)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/upslope-gpu-out}
mkdir -p "$OUT"
PY=${PY:-python}
DRY=""
[ "${1:-}" = "--cpu-dry-run" ] && DRY="--cpu-dry-run"
if [ -d .gpu_assets/wheels ] && [ -z "$DRY" ]; then
  "$PY" -m pip install --quiet --no-index --no-deps .gpu_assets/wheels/*.whl 2>&1 | tail -3
fi
SKELETON=${UPSLOPE_GPU_SKELETON:-$PWD/.gpu_assets/skeleton}
if [ ! -f "$SKELETON/tokenizer.json" ]; then
  SKELETON=$(PYTHONPATH=$PWD "$PY" -c "from upslope.models import resolve_model; print(resolve_model('smollm2-135m-instruct'))" | tail -1)
fi
export UPSLOPE_GPU_SKELETON=$SKELETON PYTHONPATH=$PWD
if [ -z "$DRY" ]; then
  timeout 240 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest -m gpu: rc=$? ($(tail -1 "$OUT/pytest_gpu.txt"))"
else
  "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest -m gpu (CPU: all skipped): rc=$? ($(tail -1 "$OUT/pytest_gpu.txt"))"
fi
timeout ${CHECK_TIMEOUT:-360} "$PY" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --skeleton "$SKELETON" $DRY
echo "gpu_check.py: rc=$? -> $OUT/gpu_check.json"
