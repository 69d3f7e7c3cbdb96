"""Held-out accuracy of async_overlap.py runs grouped by arm (max_staleness and what bounded stale samples),
one dot per seed, as a table and a PNG: how learning holds as samples get staler.

    python benchmarks/async_arms.py OUT.png ARM=RESULTS_JSON[:K][,RESULTS_JSON[:K]...] ...
    python benchmarks/async_arms.py arms.png "sync=/tmp/a/results.json:0" "2, clip=/tmp/b/results.json"

Each RESULTS_JSON is an async_overlap.py results.json; an arm takes its rows (with `:K`, only those of
max_staleness K).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def arms_from(specs: list[str]) -> dict[str, list[tuple[int, float]]]:
    """{arm label: [(seed, held-out accuracy), ...]} from ARM=FILE[,FILE] arguments."""
    arms: dict[str, list[tuple[int, float]]] = {}
    for spec in specs:
        label, _, files = spec.partition("=")
        for item in files.split(","):
            path, _, k = item.partition(":")
            rows = [r for r in json.loads(Path(path).read_text())["rows"] if not k or r["staleness"] == int(k)]
            arms.setdefault(label, []).extend((r["seed"], r["accuracy_after"]) for r in rows)
    return arms


def plot(arms: dict[str, list[tuple[int, float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for i, (label, points) in enumerate(arms.items()):
        ys = [100 * acc for _, acc in points]
        ax.scatter([i] * len(ys), ys, color="black", zorder=3)
        ax.hlines(statistics.fmean(ys), i - 0.25, i + 0.25, color="tab:blue")
    ax.set_xticks(range(len(arms)), list(arms), rotation=20, ha="right")
    ax.set_ylabel("held-out accuracy after 40 steps (%)")
    ax.set_ylim(0, 102)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("arms", nargs="+", metavar="ARM=RESULTS_JSON[:K][,...]")
    a = ap.parse_args()
    arms = arms_from(a.arms)
    print("| arm | held-out accuracy by seed | mean |\n|---|---|---|")
    for label, points in arms.items():
        by_seed = ", ".join(f"s{s} {100 * acc:.1f}%" for s, acc in sorted(points))
        print(f"| {label} | {by_seed} | {100 * statistics.fmean(acc for _, acc in points):.1f}% |")
    plot(arms, a.out)


if __name__ == "__main__":
    main()
