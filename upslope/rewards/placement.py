"""Rewards placed inside a completion. A reward may return, for a sample, a PlacedReward: parts of
its reward, each at the character offset where the text it scores ends (the process reward's step
ends). The reward stage puts each part on the token in which that offset is reached, as
batch.token_rewards (the rest of the sample's reward on its last trained token), for the
advantage estimators that take token rewards (registered with `token_rewards=True`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from upslope.batch import Batch


@dataclass(frozen=True)
class PlacedReward:
    """A sample's reward as parts (end: a character offset into the completion's text, value).
    As a float it is the parts' sum: what its token rewards add up to."""

    parts: tuple[tuple[int, float], ...]

    def __float__(self) -> float:
        return float(sum(v for _, v in self.parts))


def char_end_tokens(tokenizer: Any, ids: Sequence[int], text: str, ends: Sequence[int]) -> list[int] | None:
    """For each character offset into `text`, the index of the token of `ids` in which the decoded
    text first reaches it (the smallest k with len(decode(ids[:k + 1])) >= offset, by bisection);
    None when `ids` do not decode to `text` (the offsets would not be the ids' text)."""
    ids = list(ids)

    def chars(k: int) -> int:
        return len(tokenizer.decode(ids[:k], skip_special_tokens=True))

    if not ids or tokenizer.decode(ids, skip_special_tokens=True) != text:
        return None
    out = []
    for end in ends:
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if chars(mid) >= end:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo - 1)
    return out


def placed_token_rewards(batch: Batch, placed: dict[str, dict[int, tuple[tuple[int, float], ...]]],
                         weights: dict[str, float], tokenizer: Any, scale: torch.Tensor,
                         override: torch.Tensor) -> tuple[torch.Tensor, int]:
    """[N, L] token rewards whose row sums are batch.rewards: each placed part, times its reward's
    weight and the sample's reward_scale, on the token where its text ends (the next trained token
    when that one is not trained); the rest of the reward on the row's last trained token. A sample
    whose reward the rollout overrode keeps all of it on the last token, and so does one whose ids
    do not decode to its text: the second value counts those parts (unplaced)."""
    from upslope.algos.common import last_token_rewards

    assert batch.rewards is not None
    inside = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    unplaced = 0
    for name, samples in placed.items():
        for i, parts in samples.items():
            p, end = int(batch.prompt_lens[i]), int(batch.seq_lens[i])
            trained = torch.nonzero(batch.loss_mask[i, p:end] > 0).flatten().tolist()
            if not trained or not math.isnan(float(override[i])):  # nothing trained, or a reward set by the rollout
                continue
            where = char_end_tokens(tokenizer, batch.input_ids[i, p:end].tolist(), batch.meta[i]["completion"],
                                    [e for e, _ in parts])
            if where is None:
                unplaced += len(parts)
                continue
            for k, (_, value) in zip(where, parts):
                t = next((j for j in trained if j >= k), trained[-1])
                inside[i, p + t] += weights.get(name, 1.0) * value * float(scale[i])
    rest = batch.rewards.to(torch.float64) - inside.sum(1)
    return (inside + last_token_rewards(rest, batch.loss_mask)).float(), unplaced
