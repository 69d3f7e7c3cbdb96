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
