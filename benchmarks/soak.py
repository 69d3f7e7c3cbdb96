"""Soak test: train N steps (default 200) of the default recipe in one process tree, sample the
trainer's resident memory at every step, and check that it stays flat.

    python benchmarks/soak.py                                     # the default recipe, 200 steps
    python benchmarks/soak.py --steps 20 model.name=DIR engine.name=hf --out /tmp/soak

The trainer runs as one `upslope train` process (with its children, if any) in a fresh
`run_dir` under a temporary directory. The parent reads the RSS of the whole
process tree from /proc every 0.1 s; when the step's record appears in metrics.jsonl, the RSS
at that moment is the step's sample (the peak since the previous step is kept beside it).

Printed: the RSS slope in MiB per 100 steps, fitted by least squares over the second half of
the steps (the first half holds the warm-up: allocator pools, the engine's caches, lazily
built kernels), its standard error, and the verdict against `--threshold` (default 10 MiB per
100 steps). Why 10: growth of 10 MiB per 100 steps is 1 GiB in 10,000 steps, more steps than a
run on this kind of machine makes in days, and well inside its free memory; and it is below the
smallest leak that matters: one step's batch kept alive (the default 8 prompts x 8 completions,
token ids, masks, log-probs and advantages, ~0.15-0.3 MiB) is 15-30 MiB per 100 steps, a kept
autograd graph or logits hundreds of MiB per step. Allocator jitter of ~10 MiB between steps
gives the fit over 100 steps a standard error of ~3.5 MiB per 100 steps (printed), so 10 is
about 3 standard errors: a flat trainer passes, a per-step leak of a batch does not.

Written: `soak.png` (RSS over steps with the fit; the stacked step time split into
time/rollout, time/reward, time/learner, time/sync and the rest of time/step, from
metrics.jsonl) and `soak.json` (every sample) in `--out` (default benchmarks/results/).
Exit status 1 when the slope is over the threshold.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from upslope.logs.sinks import read_metrics

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
STAGES = ("rollout", "reward", "learner", "sync")


def tree_pids(pid: int) -> list[int]:
    """`pid` and every descendant (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return out


def rss_bytes(pids: list[int]) -> int:
    """Sum of VmRSS over `pids` (processes that are gone count 0)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def slope_per_100(steps: list[int], values: list[float]) -> tuple[float, float]:
    """Least-squares slope of values over steps, times 100, and its standard error (same units)."""
    n = len(steps)
    if n < 3:
        return float("nan"), float("nan")
    mx, my = sum(steps) / n, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in steps)
    b = sum((x - mx) * (y - my) for x, y in zip(steps, values)) / sxx
    a = my - b * mx
    resid = sum((y - a - b * x) ** 2 for x, y in zip(steps, values))
    se = (resid / (n - 2) / sxx) ** 0.5
    return b * 100, se * 100


def step_rows(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Training-step records by step (evaluation records have no time/step)."""
    return {r["step"]: r for r in rows if "time/step" in r}


def soak(steps: int, overrides: list[str], run_dir: Path, log: Path, timeout: float) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "upslope.cli", "train", f"run_dir={run_dir}", f"train.steps={steps}",
           "log.progress=false", *overrides]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
    samples: list[dict[str, Any]] = []
    seen: set[int] = set()
    peak = 0
    t0 = time.monotonic()
    metrics = run_dir / "metrics.jsonl"
    size = -1
    try:
        while True:
            done = proc.poll() is not None
            rss = rss_bytes(tree_pids(proc.pid)) if not done else 0
            peak = max(peak, rss)
            if metrics.is_file() and metrics.stat().st_size != size:
                size = metrics.stat().st_size
                for step, row in sorted(step_rows(read_metrics(metrics)).items()):
                    if step not in seen:
                        seen.add(step)
                        samples.append({"step": step, "rss_mib": rss / MIB, "peak_mib": peak / MIB,
                                        "t": time.monotonic() - t0,
                                        **{k: row[k] for k in row if k.startswith("time/")}})
                        peak = rss
                        print(f"step {step:>4}: rss {rss / MIB:8.1f} MiB  step {row['time/step']:.2f}s", flush=True)
            if done:
                break
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the run took over {timeout:.0f}s")
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise RuntimeError(f"the training run failed (exit {proc.returncode}); log {log}")
    return samples


def plot(samples: list[dict[str, Any]], fit: tuple[float, float, int], path: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [s["step"] for s in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    ax1.plot(steps, [s["rss_mib"] for s in samples], ".-", ms=3, lw=0.8, label="RSS at end of step")
    ax1.plot(steps, [s["peak_mib"] for s in samples], lw=0.6, alpha=0.6, label="peak within step")
    slope, intercept, start = fit
    xs = [x for x in steps if x >= start]
    if xs and slope == slope:
        ax1.plot(xs, [intercept + slope / 100 * x for x in xs], "r--", lw=1.2,
                 label=f"fit, second half: {slope:+.1f} MiB / 100 steps")
    ax1.set_ylabel("process-tree RSS (MiB)")
    ax1.legend(loc="best", fontsize=8)
    ax1.set_title(textwrap.fill(title, 100), fontsize=9)
    bottom = [0.0] * len(samples)
    for stage in (*STAGES, "other"):
        if stage == "other":
            vals = [max(0.0, s.get("time/step", 0.0) - sum(s.get(f"time/{k}", 0.0) for k in STAGES)) for s in samples]
        else:
            vals = [s.get(f"time/{stage}", 0.0) for s in samples]
        ax2.bar(steps, vals, bottom=bottom, width=1.0, label=f"time/{stage}" if stage != "other" else "other")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_ylim(0, max(bottom, default=1.0) * 1.25 or 1.0)  # room for the legend above the bars
    ax2.set_ylabel("seconds per step")
    ax2.set_xlabel("step")
    ax2.legend(loc="upper right", fontsize=8, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--threshold", type=float, default=10.0, help="largest |slope| counted flat, MiB per 100 steps")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where soak.png/json go")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds the run may take")
    p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model.name=DIR engine.name=hf")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="upslope-soak-"))
    try:
        samples = soak(args.steps, args.overrides, tmp / "run", args.out / "soak.log", args.timeout)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    half = [s for s in samples if s["step"] > args.steps // 2]
    slope, se = slope_per_100([s["step"] for s in half], [s["rss_mib"] for s in half])
    n = len(half)
    intercept = (sum(s["rss_mib"] for s in half) / n - slope / 100 * sum(s["step"] for s in half) / n) if n else 0
    start = half[0]["step"] if half else 0
    png = plot(samples, (slope, intercept, start), args.out / "soak.png",
               f"soak: {args.steps} steps, {' '.join(args.overrides) or 'default recipe'}")
    flat = slope == slope and abs(slope) <= args.threshold
    (args.out / "soak.json").write_text(json.dumps({
        "steps": args.steps, "overrides": args.overrides, "slope_mib_per_100_steps": slope, "slope_se": se,
        "threshold": args.threshold, "flat": flat, "samples": samples}, indent=1))
    rss = [s["rss_mib"] for s in samples]
    print(f"RSS: first {rss[0]:.1f} MiB, last {rss[-1]:.1f} MiB, max {max(rss):.1f} MiB over {len(rss)} steps")
    print(f"plot: {png or '(matplotlib missing)'}; samples: {args.out / 'soak.json'}")
    print(f"goal: flat RSS, |slope| <= {args.threshold:g} MiB per 100 steps (least squares over steps "
          f"{start}-{args.steps})")
    if n < 50:
        print(f"note: {n} steps in the fit; the slope means little below ~50 (use the default --steps 200)")
    print(f"soak: RSS slope {slope:+.2f} +- {se:.2f} MiB per 100 steps: {'flat' if flat else 'NOT FLAT'}")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
