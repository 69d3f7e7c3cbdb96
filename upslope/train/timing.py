"""One timing helper for every trainer: `with clock("rollout"): ...` adds the block's wall time
to `time/rollout`, so no stage keeps its own `perf_counter` bookkeeping."""
from __future__ import annotations

import contextlib
import time
from typing import Iterator


class StageClock:
    """Seconds spent per stage within one step (a stage entered twice, e.g. per resampling
    round, accumulates)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.spans: list[tuple[str, float, float]] = []  # (stage, wall start, wall end): the run's timeline
        self.open: dict[str, float] = {}  # stage -> wall time its current span began

    @contextlib.contextmanager
    def __call__(self, stage: str, pause: str | None = None) -> Iterator[None]:
        """Time the block and add it to `stage`. With `pause`, a stage this block runs inside (e.g. the
        learner's streamed work while it waits for rollouts) stops counting meanwhile: its time and
        its timeline span leave this block out."""
        t0, wall = time.perf_counter(), time.time()
        paused = pause is not None and pause in self.open
        if paused:
            self.spans.append((pause, self.open[pause], wall))
        self.open[stage] = wall
        try:
            yield
        finally:
            seconds, end = time.perf_counter() - t0, time.time()
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
            self.spans.append((stage, self.open.pop(stage, wall), end))
            if paused:
                self.seconds[pause] = self.seconds.get(pause, 0.0) - seconds
                self.open[pause] = end

    def reset(self) -> None:
        """Start over (a new step): no stage timed, no span."""
        self.seconds, self.spans, self.open = {}, [], {}

    def metrics(self) -> dict[str, float]:
        """`time/<stage>` for every stage timed so far."""
        return {f"time/{k}": v for k, v in self.seconds.items()}


def throughput(metrics: dict[str, float]) -> dict[str, float]:
    """Tokens per second of the rollout and the learner, from a step's token counts and stage times."""
    out = {}
    for kind, tokens in (("rollout", "rollout/generated_tokens"), ("learner", "learner/tokens")):
        seconds = metrics.get(f"time/{kind}")
        if tokens in metrics and seconds is not None:
            out[f"{kind}/tokens_per_s"] = metrics[tokens] / max(seconds, 1e-9)
    return out


def gpu_peak_gib(device: object) -> dict[str, float]:
    """`memory/gpu_peak_gib`: the most GPU memory torch held at once since the last call (the call
    resets the high-water mark), so each step reports its own peak; nothing on a CPU learner."""
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return {}
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return {"memory/gpu_peak_gib": peak}
