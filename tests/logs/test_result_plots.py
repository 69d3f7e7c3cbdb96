"""The two result scripts that draw docs figures: benchmarks/eval_curves.py (held-out accuracy of several
runs over steps) and benchmarks/async_arms.py (held-out accuracy by async arm), run as a user runs them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_eval_curves_tabulates_every_evaluation_and_draws_them(tmp_path):
    for seed, accs in enumerate([(0.2, 0.5, 0.7), (0.2, 0.6, 0.8)]):
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        rows = [{"step": 10 * i, "eval/accuracy": a} for i, a in enumerate(accs)] + [{"step": 5, "loss": 1.0}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "curve.png"
    table = run("eval_curves.py", str(tmp_path / "seed0"), str(tmp_path / "seed1"), "--out", str(out))
    assert "| 10 | 50.0% | 60.0% | 55.0% |" in table and "| 20 | 70.0% | 80.0% | 75.0% |" in table
    assert "| 5 |" not in table  # a step without an evaluation is no row
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_async_arms_groups_rows_by_arm_and_staleness(tmp_path):
    rows = [{"staleness": k, "seed": s, "accuracy_after": acc}
            for k, s, acc in [(0, 0, 0.95), (0, 1, 0.975), (2, 0, 0.70), (2, 1, 0.805)]]
    (tmp_path / "a.json").write_text(json.dumps({"args": {}, "rows": rows}))
    (tmp_path / "b.json").write_text(json.dumps({"args": {}, "rows": [{"staleness": 2, "seed": 0, "accuracy_after": 0.955}]}))
    out = tmp_path / "arms.png"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    table = run("async_arms.py", str(out), f"sync={a}:0", f"2, none={a}:2", f"2, clip={b}")
    assert "| sync | s0 95.0%, s1 97.5% | 96.2% |" in table
    assert "| 2, none | s0 70.0%, s1 80.5% | 75.2% |" in table
    assert "| 2, clip | s0 95.5% | 95.5% |" in table
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
