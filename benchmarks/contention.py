"""A busy machine: how the rollout engine's speed falls when other processes compete for the
cores, with upslope's thread count fixed at every core (`before`: train.threads=<all cores>, the
old default) and fitted to the free cores (`after`: train.threads=0, the default now).

For 0, 1 and 2 competing busy processes (`python -c "while True: pass"`, unpinned), each cell runs
in a fresh subprocess through the command line:
  eval   upslope eval (default engine: vLLM when importable), eval.limit prompts: tokens/s
  train  upslope train for --steps steps, no evaluation: median seconds per step, rollout tokens/s
Optional variants: `passive`, the `before` thread count with OMP_WAIT_POLICY=PASSIVE (OpenMP
threads sleep instead of spinning at barriers); `after_passive`, both.

A cell that runs past --timeout is reported as such (its speed is then below what the row shows).
The busy processes start before each cell and are killed after it.

Usage (a quiet machine gives the real table; state the load otherwise):
  python benchmarks/contention.py                       # eval 200 prompts + 5-step train, 0/1/2 busy
  python benchmarks/contention.py --quick               # eval 32 prompts + 2-step train, 150 s cap a cell
  python benchmarks/contention.py --workloads eval --variants before after passive
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
VARIANTS = {
    "before": lambda cores: ([f"train.threads={cores}"], {}),
    "after": lambda cores: (["train.threads=0"], {}),
    "passive": lambda cores: ([f"train.threads={cores}"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "after_passive": lambda cores: (["train.threads=0"], {"OMP_WAIT_POLICY": "PASSIVE"}),
}


def run_cell(workload: str, variant: str, busy: int, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One measurement in a fresh process, with `busy` spinning processes alongside."""
    cores = len(os.sched_getaffinity(0))
    overrides, env_extra = VARIANTS[variant](cores)
    run_dir = work / f"{workload}-{variant}-{busy}"
    common = [f"run_dir={run_dir}", "log.progress=false", "log.plot=false", "log.tensorboard=false",
              f"engine.name={a.engine}", *overrides]
    if workload == "eval":
        argv = ["eval", f"eval.limit={a.limit}", *common]
    else:
        argv = ["train", f"train.steps={a.steps}", "train.eval_before=false", "train.eval_after=false",
                "train.eval_every=0", *common]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "upslope.cli", *argv], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=a.timeout)
        wall, rc, err = time.perf_counter() - start, proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        wall, rc, err = a.timeout, None, (exc.stderr or b"").decode(errors="replace") if isinstance(
            exc.stderr, bytes) else (exc.stderr or "")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    row: dict[str, Any] = {"workload": workload, "variant": variant, "busy": busy, "wall_s": round(wall, 1),
                           "status": "ok" if rc == 0 else ("timeout" if rc is None else f"exit {rc}")}
    if rc not in (0, None):
        row["error"] = (err.strip().splitlines() or [""])[-1][:200]
    if workload == "eval" and (run_dir / "eval_summary.json").exists():
        s = json.loads((run_dir / "eval_summary.json").read_text())
        row["tokens_per_s"] = s.get("tokens_per_s")
    elif workload == "train" and (run_dir / "metrics.jsonl").exists():
        steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in steps if "time/step" in m]
        if steps:
            row["s_per_step"] = round(statistics.median(m["time/step"] for m in steps), 2)
            row["rollout_tokens_per_s"] = round(statistics.median(m["rollout/tokens_per_s"] for m in steps), 1)
            row["steps_done"] = len(steps)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | busy processes | variant | tokens/s | s/step | wall s | status |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        tps = r.get("tokens_per_s", r.get("rollout_tokens_per_s", "-"))
        lines.append(f"| {r['workload']} | {r['busy']} | {r['variant']} | {tps} | {r.get('s_per_step', '-')} | "
                     f"{r['wall_s']} | {r['status']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="eval.limit 32, 2 train steps, 150 s per cell")
    p.add_argument("--workloads", nargs="+", default=["eval", "train"], choices=["eval", "train"])
    p.add_argument("--variants", nargs="+", default=["before", "after"], choices=sorted(VARIANTS))
    p.add_argument("--busy", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--limit", type=int, default=200, help="eval prompts")
    p.add_argument("--steps", type=int, default=5, help="train steps")
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"])
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a cell is stopped")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    a = p.parse_args()
    if a.quick:
        a.limit, a.steps, a.timeout = min(a.limit, 32), min(a.steps, 2), min(a.timeout, 150.0)
    loads = open("/proc/loadavg").read().split()[:3]
    print(f"# contention: {len(os.sched_getaffinity(0))} cores, load average before: {' '.join(loads)}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="upslope-contention-") as tmp:
        for workload in a.workloads:
            for busy in a.busy:
                for variant in a.variants:  # before/after side by side, under the same conditions
                    row = run_cell(workload, variant, busy, a, Path(tmp))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    print(table(rows))
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
