"""Exploration filters (issue 21, part 2): which of an over-sampled group's rollouts to train on."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.batch import Batch
from upslope.registry import FILTERS


def darts_scores(batch: Batch, *, length_coef: float) -> Tensor:
    """Per sample: confidence (mean sampler log-prob of its tokens) minus length_coef x its token count
    relative to the longest completion of the batch (higher: more confident and more concise)."""
    gen = (batch.loss_mask > 0).float()
    tokens = gen.sum(1).clamp(min=1)
    confidence = (batch.sampler_logprobs * gen).sum(1) / tokens
    return confidence - length_coef * tokens / tokens.max()


@FILTERS.register("darts")
def darts(batch: Batch, *, keep: int = 8, length_coef: float = 1.0, balance: bool = True) -> Tensor:
    """DARTS: over-sample each group (rollout.n > keep), then keep the `keep` most concise and confident.

    keep: rollouts kept per group (the group size the update sees)
    length_coef: weight of conciseness against confidence in the score (0: confidence only)
    balance: keep right and wrong rollouts (reward >= 0.5) in the group's proportion, best-scored of each,
    so selection never empties a group's reward variance; false: the top `keep` regardless of reward

    The abstract does not fix the score; a shorter completion and a higher mean token log-prob both
    count, and ties keep the earlier sample.
    """
    score = darts_scores(batch, length_coef=length_coef)
    right = (batch.rewards >= 0.5) if (balance and batch.rewards is not None) else torch.zeros(batch.size, dtype=torch.bool)
    kept = torch.zeros(batch.size, dtype=torch.bool)
    for g in batch.group_ids.unique():
        rows = torch.nonzero(batch.group_ids == g).flatten()
        k = min(keep, rows.numel())
        n_right = int(right[rows].sum())
        quota_right = round(k * n_right / rows.numel())  # 0 without balance: every row is "wrong"
        if 0 < n_right < rows.numel():  # a mixed group stays mixed
            quota_right = min(max(quota_right, 1), k - 1)
        for part, quota in ((rows[right[rows]], quota_right), (rows[~right[rows]], k - quota_right)):
            order = sorted(part.tolist(), key=lambda i: (-float(score[i]), i))
            kept[order[:quota]] = True
    return kept
