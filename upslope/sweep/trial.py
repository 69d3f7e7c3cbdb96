"""One trial of a sweep: the configuration it tries and the scores it reached, rung by rung; the
record the runner saves in sweep.json and the report tabulates."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trial:
    """One configuration of the sweep and what it reached: scores by rung step (None: it failed there)."""

    id: str
    point: dict[str, Any]
    scores: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None
    stopped: int | None = None  # the rung step after which it was not promoted
    trend: str | None = None  # why its training metric's trend stopped it (trend_metric), if it did
    seconds: float = 0.0

    @property
    def reached(self) -> int:
        """The largest rung step it has a score at (0: none)."""
        done = [int(s) for s, v in self.scores.items() if v is not None]
        return max(done, default=0)
