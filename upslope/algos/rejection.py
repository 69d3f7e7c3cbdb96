"""Rejection sampling for RFT (expert iteration): which sampled completions to fine-tune on."""
from __future__ import annotations

from typing import Hashable, Sequence


def keep_indices(rewards: Sequence[float], group_ids: Sequence[int], keys: Sequence[Hashable], *,
                 threshold: float, dedupe: bool = True, max_per_prompt: int | None = None) -> list[int]:
    """Indices of the samples to keep, in sample order: reward >= threshold; with `dedupe`
    only the first of identical completions (equal `keys`) of a prompt (`group_ids`); at
    most `max_per_prompt` per prompt (None: no cap)."""
    kept: list[int] = []
    seen: set[tuple[int, Hashable]] = set()
    count: dict[int, int] = {}
    for i, (r, g, k) in enumerate(zip(rewards, group_ids, keys)):
        if not r >= threshold:  # NaN rewards are never kept
            continue
        if dedupe and (g, k) in seen:
            continue
        if max_per_prompt is not None and count.get(g, 0) >= max_per_prompt:
            continue
        seen.add((g, k))
        count[g] = count.get(g, 0) + 1
        kept.append(i)
    return kept
