"""Plots of a run: training reward and held-out accuracy over steps (PNG)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


Line = tuple[str, str, dict[str, Any]]  # (metric key, legend label, style keywords; "fmt": e.g. "o-")


def plot_curves(records: list[dict[str, Any]], out: Path, lines: list[Line], title: str = "",
                ylabel: str | None = None) -> Path | None:
    """One curve per (key, label, style) over the records that hold the key, on a [0, 1] axis;
    None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, style in lines:
        rows = [r for r in records if key in r]
        if rows:
            kw = {k: v for k, v in style.items() if k != "fmt"}
            fmt = (style["fmt"],) if "fmt" in style else ()
            ax.plot([r["step"] for r in rows], [r[key] for r in rows], *fmt, label=label, **kw)
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")  # the fewest points hidden: a hacked run has its accuracy down where "lower right" sits
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_run(records: list[dict[str, Any]], out: Path, title: str = "") -> Path | None:
    """reward/mean and accuracy per step, eval accuracy as markers; None if matplotlib is missing."""
    train = [r for r in records if "reward/mean" in r]
    lines: list[Line] = [("reward/mean", "train reward (mean)", {"lw": 1.2})]
    if train and all("accuracy" in r for r in train) and any(r["accuracy"] != r["reward/mean"] for r in train):
        lines.append(("accuracy", "train accuracy", {"lw": 0.8, "alpha": 0.6}))
    lines.append(("eval/accuracy", "held-out accuracy (greedy)", {"fmt": "o-", "color": "black"}))
    return plot_curves(records, out, lines, title)


def plot_timeline(events: list[dict[str, Any]], out: Path, title: str = "") -> Path | None:
    """Who was busy when in one run (a row per worker: its jobs, and its weight loads in orange; the
    learner's update and its wait for rollouts; the weight pushes), from a pipeline run's
    timeline.jsonl; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not events:
        return None
    t0 = min(e["start"] for e in events)
    rows = sorted({e["who"] for e in events}, key=lambda w: (w.startswith("worker"), w))
    colors = {"learner": "tab:blue", "learner_wait": "lightgray", "push": "tab:red", "load": "tab:orange"}
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.5))
    for y, who in enumerate(rows):
        mine = [e for e in events if e["who"] == who]
        spans = [(e["start"] - t0, max(e["end"] - e["start"], 1e-3)) for e in mine]
        ax.broken_barh(spans, (y - 0.35, 0.7),
                       facecolors=[colors.get(e.get("kind", who), "tab:green") for e in mine])
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("seconds since the first event")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
