"""Held-out accuracy over steps for several runs (seeds of one recipe, or recipes side by side): a
markdown table (one column per run, plus the mean) and a PNG with one curve per run.

    python benchmarks/eval_curves.py runs/headroom/seed0 runs/headroom/seed1 runs/headroom/seed2 --out curve.png
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from upslope.logs.plot import plot_curves


def eval_points(run_dir: Path, key: str) -> dict[int, float]:
    """{step: value} of every evaluation record of a run's metrics.jsonl."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r[key] for r in rows if key in r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories")
    ap.add_argument("--key", default="eval/accuracy", help="the evaluation metric")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    curves = {str(r): eval_points(r, a.key) for r in a.runs}
    steps = sorted(set().union(*curves.values()))
    print("| step | " + " | ".join(Path(n).name for n in curves) + " | mean |")
    print("|---" * (len(curves) + 2) + "|")
    for s in steps:
        vals = [c.get(s) for c in curves.values()]
        known = [v for v in vals if v is not None]
        cells = " | ".join("" if v is None else f"{100 * v:.1f}%" for v in vals)
        print(f"| {s} | {cells} | {100 * statistics.fmean(known):.1f}% |")
    records = [{"step": s, **{name: c[s] for name, c in curves.items() if s in c}} for s in steps]
    plot_curves(records, a.out, [(name, Path(name).name, {"fmt": "o-"}) for name in curves], a.title,
                ylabel=a.key)


if __name__ == "__main__":
    main()
