"""Rich progress bars and tables for long work."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)  # progress, warnings and errors
notes = Console()  # set-up notes: what was chosen and where files went (stdout, so one error line stays alone on stderr)


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


# (label, metric key, format) shown on each step's line when the method logs that metric
STEP_FIELDS = [("reward", "reward/mean", ".3f"), ("acc", "accuracy", ".3f"), ("len", "length/mean", ".1f"),
               ("loss", "loss", "+.4f"), ("ent", "entropy", ".3f"), ("kl", "kl", ".4f"),
               ("mismatch", "mismatch", ".4f"), ("pref_acc", "pref/accuracy", ".3f"), ("pairs", "pairs/kept", ".0f"), ("kept", "rft/kept", ".0f")]
TIME_FIELDS = [("roll", "time/rollout", ".1f"), ("rew", "time/reward", ".2f"), ("learn", "time/learner", ".1f"),
               ("sync", "time/sync", ".2f")]


def step_line(step: int, m: dict[str, Any]) -> str:
    """One line per step with the metrics this method logs (an SFT step has no reward)."""
    def fields(spec: list[tuple[str, str, str]]) -> str:
        return " ".join(f"{label} {m[key]:{fmt}}" for label, key, fmt in spec if isinstance(m.get(key), (int, float)))

    times = fields(TIME_FIELDS)
    return (f"step {step}: {fields(STEP_FIELDS)} | {m.get('time/step', 0):.1f}s" + (f" ({times})" if times else ""))


class _StepDisplay:
    def __init__(self, progress: Progress | None, task: Any):
        self.progress, self.task = progress, task

    def update(self, step: int, m: dict[str, Any]) -> None:
        console.print(step_line(step, m), highlight=False)
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


class Report:
    """The run's human-readable messages: set-up notes on stdout; warnings, results and the rest on
    stderr beside the progress display. Trainers and the loop report through this sink, never the
    console directly."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def note(self, message: str) -> None:
        """A low-key line (set-up details, where files went), on stdout."""
        if self.enabled:
            notes.print(f"[dim]{message}[/dim]")

    def warn(self, message: str) -> None:
        """Something the user should know (data dropped, options ignored)."""
        self._print(f"[yellow]{message}[/]")

    def info(self, message: str) -> None:
        """A plain line (resume, stop)."""
        self._print(message)

    def result(self, message: str) -> None:
        """A headline result (evaluation)."""
        self._print(f"[bold]{message}[/]")

    def _print(self, markup: str) -> None:
        if self.enabled:
            console.print(markup)
