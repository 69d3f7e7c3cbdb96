"""benchmarks/torture.py on the tiny model: SIGKILL a deterministic run at random moments,
resume it each time, and find it bit-identical to an uninterrupted run; and its comparison
catches a run that differs."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "torture.py"


@pytest.fixture(scope="module")
def torture():
    spec = importlib.util.spec_from_file_location("benchmarks_torture", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.mark.slow  # about 60 s; the resume tests of test_loop.py cover exact resume in the default run
def test_kills_resume_identically(tiny_model_path):
    """2 kills (seed 0: both after a checkpoint appeared, so both resume from one) in 4 steps
    with an evaluation every 2 steps; every resume is found identical to the straight run."""
    cmd = [sys.executable, str(SCRIPT), "--kills", "2", "--steps", "4", "--seed", "0", "--threads", "1",
           "--timeout", "120", f"model.name={tiny_model_path}", "engine.name=hf", "log.tensorboard=false",
           "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=8", "train.eval_before=false",
           "train.eval_after=false", "train.eval_every=2", "eval.limit=4", "train.micro_batch_tokens=512"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert out.strip().splitlines()[-1] == "torture: 2/2 kills resumed identically", out
    assert "resumed from" in out and "step_00000" in out, out  # at least one real resume, not fresh starts
    assert "final: metrics.jsonl" in out and "weights identical" in out, out


def rows(*rewards: float) -> list[dict]:
    return [{"step": i + 1, "reward/mean": r, "loss": 0.5, "time/step": 1.0 + i, "rollout/tokens_per_s": 9.0 * i,
             "eval/gen_seconds": 3.0 * i} for i, r in enumerate(rewards)]


def test_comparison_ignores_timing_only(torture, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in rows(0.1, 0.2)))
    other = rows(0.1, 0.2)
    for r in other:  # timing keys differ on every run: not compared
        r["time/step"] += 5
        r["rollout/tokens_per_s"] += 1
        r["eval/gen_seconds"] += 1
    b.write_text("".join(json.dumps(r) + "\n" for r in other) + '{"step": 3, "torn')  # torn last line: skipped
    assert torture.compare_metrics(torture.read_metrics(a), torture.read_metrics(b)) == []

    b.write_text("".join(json.dumps(r) + "\n" for r in rows(0.1, 0.2000001)))
    diffs = torture.compare_metrics(torture.read_metrics(a), torture.read_metrics(b))
    assert len(diffs) == 1 and "step 2" in diffs[0] and "reward/mean" in diffs[0]
    assert torture.compare_metrics(rows(0.1, 0.2), rows(0.1)) == ["2 records vs 1"]
    extra = rows(0.1)
    extra[0]["eval/accuracy"] = 0.5
    assert torture.compare_metrics(rows(0.1), extra)  # a key only one side has is a difference


def test_weight_comparison_catches_one_changed_value(torture, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    w = {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3), "y": torch.ones(4, dtype=torch.bfloat16)}
    save_file(w, a / "model.safetensors")
    save_file({k: v.clone() for k, v in w.items()}, b / "model.safetensors")
    assert torture.compare_weights(a, b) == []
    changed = {k: v.clone() for k, v in w.items()}
    changed["x"][1, 2] = torch.nextafter(changed["x"][1, 2], torch.tensor(100.0))
    save_file(changed, b / "model.safetensors")
    assert torture.compare_weights(a, b) == ["tensor x differs"]
    save_file({"x": w["x"]}, b / "model.safetensors")
    assert any("names differ" in d for d in torture.compare_weights(a, b))
    save_file({"x": w["x"], "y": w["y"].float()}, b / "model.safetensors")  # same values, other dtype
    assert torture.compare_weights(a, b) == ["tensor y differs"]
