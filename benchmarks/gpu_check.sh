#!/usr/bin/env bash
# One prepared check for a lent GPU machine (no network; about 7 minutes): install the carried
# wheels into /tmp/site (the device's Python may not allow installs into its own environment),
# then benchmarks/gpu_check.py, whose parts each run under their own time limit and write their
# results as they finish: the gpu tests, engine tokens/s (hf, hf_paged), learner MFU on random-init
# 0.5B and 1.7B shapes, a few loop steps with their time split and GPU memory, FSDP2 at world size 1.
# Results: $OUT/gpu_check.json, $OUT/gpu_check.md (summary), $OUT/pytest_gpu.txt.
#   here:    bash benchmarks/gpu_prepare.sh                    (wheels + tokenizer skeleton into .gpu_assets)
#   device:  bash benchmarks/gpu_check.sh                      (carry .gpu_assets)
#   here:    bash benchmarks/gpu_check.sh --cpu-dry-run        (tiny shapes on the CPU: proves the script)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/upslope-gpu-out}
WORK=${UPSLOPE_GPU_WORK:-$(mktemp -d /tmp/upslope-gpu-work.XXXXXX)}
mkdir -p "$OUT" "$WORK"
PY=${PY:-python3}
DRY=""
[ "${1:-}" = "--cpu-dry-run" ] && DRY="--cpu-dry-run"
if [ -d .gpu_assets/wheels ] && [ -z "$DRY" ]; then
  SITE=${UPSLOPE_GPU_SITE:-/tmp/site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .gpu_assets/wheels/*.whl 2>&1 | tail -3
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
SKELETON=${UPSLOPE_GPU_SKELETON:-$PWD/.gpu_assets/skeleton}
if [ ! -f "$SKELETON/tokenizer.json" ]; then
  SKELETON=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    "from upslope.models import resolve_model; print(resolve_model('smollm2-135m-instruct'))" | tail -1)
fi
export UPSLOPE_GPU_SKELETON=$SKELETON
[ -d .gpu_assets/data ] && [ -z "$DRY" ] && export UPSLOPE_DATA_DIR=${UPSLOPE_DATA_DIR:-$PWD/.gpu_assets/data}
"$PY" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --skeleton "$SKELETON" --work "$WORK" \
  --budget "${UPSLOPE_GPU_BUDGET:-420}" ${UPSLOPE_GPU_ONLY:+--only "$UPSLOPE_GPU_ONLY"} $DRY
rc=$?
echo "gpu_check.py: rc=$rc -> $OUT/gpu_check.json"
exit $rc
