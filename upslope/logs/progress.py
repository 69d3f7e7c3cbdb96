"""Rich progress bars and tables for long work."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)


class _Bar:
    def __init__(self, progress: Progress | None, task: Any):
        self.progress, self.task = progress, task

    def advance(self, n: int = 1, **fields: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=n, **fields)

    def update(self, **fields: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, **fields)


@contextlib.contextmanager
def progress_bar(description: str, total: int, enabled: bool = True, stats: str = "{task.fields[tokens_per_s]:.0f} tok/s"
                 ) -> Iterator[_Bar]:
    """A progress bar with a live statistic; a no-op when disabled."""
    if not enabled:
        yield _Bar(None, None)
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn(stats), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=not sys.stderr.isatty()) as progress:
        task = progress.add_task(description, total=total, tokens_per_s=0.0)
        yield _Bar(progress, task)


def summary_table(title: str, rows: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in rows.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items()) or "-"
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    return table


class _StepDisplay:
    def __init__(self, progress: Progress | None, task: Any):
        self.progress, self.task = progress, task

    def update(self, step: int, m: dict[str, Any]) -> None:
        line = (f"step {step}: reward {m.get('reward/mean', 0):.3f} acc {m.get('accuracy', 0):.3f} "
                f"len {m.get('length/mean', 0):.1f} loss {m.get('loss', 0):+.4f} ent {m.get('entropy', 0):.3f} "
                f"kl {m.get('kl', 0):.4f} mismatch {m.get('mismatch', 0):.4f} | {m.get('time/step', 0):.1f}s "
                f"(roll {m.get('time/rollout', 0):.1f} rew {m.get('time/reward', 0):.2f} "
                f"learn {m.get('time/learner', 0):.1f} sync {m.get('time/sync', 0):.2f})")
        console.print(line, highlight=False)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, reward=m.get("reward/mean", 0.0),
                                 acc=m.get("accuracy", 0.0))


@contextlib.contextmanager
def step_display(total: int, start: int = 0, enabled: bool = True) -> Iterator[_StepDisplay]:
    """Live training progress: a bar with reward and accuracy, plus one line per step."""
    if not enabled or not sys.stderr.isatty():
        yield _StepDisplay(None, None)
        return
    columns = [TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
               TextColumn("reward {task.fields[reward]:.3f} acc {task.fields[acc]:.3f}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=total, completed=start, reward=0.0, acc=0.0)
        yield _StepDisplay(progress, task)
