"""The decisions of a successive-halving sweep, as pure functions: which configurations to try, how
many trials each rung keeps, and which trials a rung promotes."""
from __future__ import annotations

import itertools
import math
import random
from typing import Any, Mapping, Sequence

from upslope.sweep.spec import Range


def rung_sizes(trials: int, eta: int, rungs: int) -> list[int]:
    """Trials at each rung: all of them at the first, then the best floor(n / eta) (at least one)."""
    sizes = [trials]
    for _ in range(rungs - 1):
        sizes.append(max(1, sizes[-1] // eta))
    return sizes


def draw(dim: list[Any] | Range, rng: random.Random) -> Any:
    """One value of a dimension: a list's element, or a sample of a range (floats to 6 significant digits)."""
    if isinstance(dim, list):
        return rng.choice(dim)
    low, high = dim.bounds
    if dim.kind == "int_uniform":
        return rng.randint(int(low), int(high))
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if dim.kind == "log_uniform" else rng.uniform(low, high)
    return float(f"{min(max(value, low), high):.6g}")


def sample_points(space: Mapping[str, list[Any] | Range], budget: int, seed: int) -> list[dict[str, Any]]:
    """The configurations of a sweep: with lists only, the whole grid (in order) when it has at most
    `budget` points, else `budget` distinct grid points drawn with `seed`; with a range, `budget` draws."""
    keys = list(space)
    if all(isinstance(space[k], list) for k in keys):
        grid = [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]
        return grid if len(grid) <= budget else random.Random(seed).sample(grid, budget)
    rng = random.Random(seed)
    return [{k: draw(space[k], rng) for k in keys} for _ in range(budget)]


def ranked(scores: Mapping[str, float | None], goal: str) -> list[str]:
    """Trial ids with a score, best first (ties: the earlier id); trials without one are left out."""
    sign = -1.0 if goal == "max" else 1.0
    return sorted((t for t, v in scores.items() if v is not None and not math.isnan(v)),
                  key=lambda t: (sign * float(scores[t]), t))  # type: ignore[arg-type]


def promoted(scores: Mapping[str, float | None], keep: int, goal: str) -> list[str]:
    """The `keep` best trials of a rung, in id order (failed trials never go on)."""
    return sorted(ranked(scores, goal)[:keep])


def steps_trained(rungs: Sequence[int], reached: Sequence[int]) -> int:
    """Steps a sweep trains when trial i reaches rung index reached[i] (-1: none), each rung resuming the last."""
    return sum(rungs[r] for r in reached if r >= 0)


def trend_slope(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares slope per step of (step, value) points (0 with fewer than two distinct steps)."""
    if len(points) < 2:
        return 0.0
    xs, ys = [float(s) for s, _ in points], [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def trend_verdict(points: Sequence[tuple[int, float]], *, window: int, min_slope: float, drop: float,
                  goal: str) -> str | None:
    """Why a trial's training metric says stop, read from its last `window` (step, value) points: `collapsing`
    when the latest value is worse than the window's best by more than `drop`, `flat` when the least-squares
    slope per step (in the goal's direction: up for max) is at or below `min_slope`; None: it is still
    improving, or it has fewer than `window` points (too few to read a trend from)."""
    if len(points) < window:
        return None
    last = points[-window:]
    sign = 1.0 if goal == "max" else -1.0
    values = [sign * v for _, v in last]
    fall = max(values) - values[-1]
    if fall > drop:
        return f"collapsing: {fall:.4g} below the window's best"
    slope = sign * trend_slope(last)
    if slope <= min_slope:
        return f"flat: slope {sign * slope:.4g}/step over {window} steps"
    return None
