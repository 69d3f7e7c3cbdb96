"""The precision matrix on this machine: rollout-engine tokens/s and learner tokens/s in each
precision, and whether `auto` picked the fastest cell (goal: within 10% of the best).

Engine cells: `upslope eval` (eval.limit prompts, the task's 8 new tokens) for each importable
engine (vllm, hf) x engine.dtype (float32, bfloat16); tokens/s from eval_summary.json.
Learner cells: `upslope train` (HF engine for the rollouts, no evaluation, every row trained:
train.skip_zero_advantage=false) for train.precision/model.dtype = float32/float32 (fp32),
bfloat16/bfloat16 (bf16 weights) and bfloat16/float32 (mixed: bf16 autocast over fp32 weights);
learner/tokens_per_s from metrics.jsonl, median over the steps after the first.
Each cell is a fresh subprocess. `auto`'s choice is what `upslope config show` resolves here.

Usage:
  python benchmarks/precision_matrix.py            # eval 200 prompts, 4 train steps a cell
  python benchmarks/precision_matrix.py --quick    # eval 64 prompts, 2 train steps a cell
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LEARNER = {"fp32": ("float32", "float32"), "bf16": ("bfloat16", "bfloat16"), "mixed": ("bfloat16", "float32")}
QUIET = ["log.progress=false", "log.plot=false", "log.tensorboard=false"]


def cli(argv: list[str], timeout: float) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "upslope.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return "timeout", timeout
    status = "ok" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1][:160]
    return status, time.perf_counter() - start


def engine_cell(engine: str, dtype: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    run_dir = work / f"eval-{engine}-{dtype}"
    status, wall = cli(["eval", f"run_dir={run_dir}", f"engine.name={engine}", f"engine.dtype={dtype}",
                        f"eval.limit={a.limit}", *QUIET], a.timeout)
    row = {"kind": "engine", "engine": engine, "dtype": dtype, "status": status, "wall_s": round(wall, 1)}
    summary = run_dir / "eval_summary.json"
    if summary.exists():
        row["tokens_per_s"] = json.loads(summary.read_text())["tokens_per_s"]
    return row


def learner_cell(name: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    precision, weights = LEARNER[name]
    run_dir = work / f"train-{name}"
    status, wall = cli(["train", f"run_dir={run_dir}", "engine.name=hf", f"train.precision={precision}",
                        f"model.dtype={weights}", f"train.steps={a.steps}", "train.skip_zero_advantage=false",
                        "train.eval_before=false", "train.eval_after=false", "train.eval_every=0", *QUIET],
                       a.timeout)
    row = {"kind": "learner", "precision": name, "status": status, "wall_s": round(wall, 1)}
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = [m for m in map(json.loads, metrics.read_text().splitlines()) if "learner/tokens_per_s" in m]
        timed = steps[1:] or steps  # the first step includes warm-up
        if timed:
            row["tokens_per_s"] = round(statistics.median(m["learner/tokens_per_s"] for m in timed), 1)
    return row


def auto_choice() -> dict[str, str]:
    from upslope.config import load_config
    from upslope.rollout.engines import engine_name

    cfg = load_config()
    learner = next(k for k, v in LEARNER.items() if v == (cfg.train.precision, cfg.model.dtype))
    return {"engine": engine_name(cfg.engine), "engine_dtype": cfg.engine.dtype, "learner": learner}


def compare(label: str, cells: list[dict[str, Any]], picked_name: str, key: str) -> str | None:
    """One line: auto's cell against the best measured one (goal: within 10%)."""
    cells = [r for r in cells if r.get("tokens_per_s")]
    picked = next((r for r in cells if r[key] == picked_name), None)
    if picked is None:
        return None
    best = max(cells, key=lambda r: r["tokens_per_s"])
    ratio = picked["tokens_per_s"] / best["tokens_per_s"]
    return (f"{label}: auto picked {picked[key]} ({picked['tokens_per_s']} tokens/s), best {best[key]} "
            f"({best['tokens_per_s']}): {ratio:.0%} of best -> {'OK' if ratio >= 0.9 else 'MISS'}")


def verdict(rows: list[dict[str, Any]], auto: dict[str, str]) -> list[str]:
    """Whether auto's engine dtype and learner precision are within 10% of the best measured cell."""
    engine = [r for r in rows if r["kind"] == "engine" and r["engine"] == auto["engine"]]
    learner = [r for r in rows if r["kind"] == "learner"]
    lines = (compare(f"engine {auto['engine']}", engine, auto["engine_dtype"], "dtype"),
             compare("learner", learner, auto["learner"], "precision"))
    return [line for line in lines if line]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="eval 64 prompts, 2 train steps, 300 s per cell")
    p.add_argument("--limit", type=int, default=200, help="eval prompts per engine cell")
    p.add_argument("--steps", type=int, default=4, help="train steps per learner cell")
    p.add_argument("--engines", nargs="+", default=None, help="default: vllm (when importable) and hf")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--out", type=Path, default=None, help="also write rows + verdict as JSON here")
    a = p.parse_args()
    if a.quick:
        a.limit, a.steps, a.timeout = min(a.limit, 64), min(a.steps, 2), min(a.timeout, 300.0)
    from upslope import hardware

    hw = hardware.machine()
    print(f"# {hw.describe()}\n# matmul rates (1 thread, cached): {hw.rates}\n"
          f"# load average: {' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)
    engines = a.engines or (["vllm", "hf"] if hw.vllm else ["hf"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="upslope-precision-") as tmp:
        for engine in engines:
            for dtype in ("float32", "bfloat16"):
                rows.append(engine_cell(engine, dtype, a, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
        for name in LEARNER:
            rows.append(learner_cell(name, a, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    auto = auto_choice()
    print("\n| cell | tokens/s | status |\n|---|---|---|")
    for r in rows:
        cell = f"engine {r['engine']} {r['dtype']}" if r["kind"] == "engine" else f"learner {r['precision']}"
        print(f"| {cell} | {r.get('tokens_per_s', '-')} | {r['status']} |")
    lines = verdict(rows, auto)
    print(f"\nauto here: {auto}\n" + "\n".join(lines))
    if a.out:
        a.out.write_text(json.dumps({"hardware": hw.describe(), "rows": rows, "auto": auto, "verdict": lines},
                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
