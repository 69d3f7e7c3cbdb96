"""Benchmarks are run by hand, so one that breaks with a code change is found only when someone
needs its numbers. These run the workers of the side-by-side and memory benchmarks for one real
step (the real model and engine) and check what they report; slow, so outside the default run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_grpo_vs_trl_upslope_worker_reports_a_step(tmp_path):
    out = _run(["benchmarks/grpo_vs_trl.py", "--worker", "upslope", "--steps", "1", "--run-dir", str(tmp_path)])
    assert out.returncode == 0, out.stderr[-2000:]
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    meta = next(e for e in events if e["event"] == "meta")
    step = next(e for e in events if e["event"] == "step")
    assert meta["framework"] == "upslope" and meta["moments_dtype"] in ("int8", "bfloat16", "float32")
    assert step["step"] == 1 and step["step_s"] > 0 and step["rollout_s"] > 0


def test_step_memory_reports_every_stage():
    out = _run(["benchmarks/step_memory.py", "--steps", "1"])
    assert out.returncode == 0, out.stderr[-2000:]
    for stage in ("collect", "update", "sync", "process peak"):
        assert stage in out.stdout, out.stdout
