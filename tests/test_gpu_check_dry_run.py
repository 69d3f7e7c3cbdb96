"""The prepared GPU check (benchmarks/gpu_check.sh) run on the CPU with --cpu-dry-run: every part runs
end to end on tiny shapes and records what a GPU run records, so the script a lent GPU machine runs
is known to work before the machine's minutes are spent on it. No number here is a GPU result."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from markers import IN_CI_SLOW_SET

# seven parts, each its own Python process (the FSDP part spawns two): about 50 s on a 2-core CPU; run it
# (`pytest -m slow tests/test_gpu_check_dry_run.py`) before spending a lent machine's minutes
pytestmark = IN_CI_SLOW_SET

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "UPSLOPE_GPU_WORK": str(work), "PY": sys.executable,
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--cpu-dry-run"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    parts = report["parts"]
    assert report["dry_run"] and list(parts) == ["env", "fsdp", "pytest", "models", "engine", "learner", "loop"]
    assert all(part["_run"]["rc"] == 0 for part in parts.values()), {k: v["_run"] for k, v in parts.items()}
    assert parts["env"]["matmul_peak_tflops"]["fp32"] > 0
    assert parts["fsdp"]["fsdp"]["sharded"] and parts["fsdp"]["fsdp"]["ok"]
    assert "skipped" in parts["pytest"]["pytest"]["summary"]  # no CUDA here: every gpu test skips
    engine = parts["engine"]["engine"]
    for name in ("hf", "hf_paged", "hf_paged+graphs"):
        assert all(0 < engine[f"{name}/batch_{b}"]["tokens"] <= b * 8 for b in (2, 4)), engine
    cells = parts["learner"]["cells"]
    assert len(cells) == 2 and all(c["tokens_per_s"] > 0 and 0 < c["mfu"] for c in cells), cells
    assert parts["learner"]["profile"], "no profile of the update"
    steps = parts["loop"]["loop"]["steps"]
    assert [s["step"] for s in steps] == [1, 2] and all(s["time/rollout"] > 0 for s in steps)
    summary = (out / "gpu_check.md").read_text()
    assert "| engine | batch | tokens/s |" in summary and "| shape | precision |" in summary
