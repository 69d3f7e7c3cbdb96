"""Plots of a run: training reward and held-out accuracy over steps (PNG)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_run(records: list[dict[str, Any]], out: Path, title: str = "") -> Path | None:
    """reward/mean and accuracy per step, eval accuracy as markers; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    train = [r for r in records if "reward/mean" in r]
    evals = [r for r in records if "eval/accuracy" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([r["step"] for r in train], [r["reward/mean"] for r in train], label="train reward (mean)", lw=1.2)
        if all("accuracy" in r for r in train) and any(r["accuracy"] != r["reward/mean"] for r in train):
            ax.plot([r["step"] for r in train], [r["accuracy"] for r in train], label="train accuracy", lw=0.8,
                    alpha=0.6)
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval/accuracy"] for r in evals], "o-", color="black",
                label="held-out accuracy (greedy)")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
