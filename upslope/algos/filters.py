"""Batch filters: `fn(batch, *, options) -> keep BoolTensor[N]`, plus the DAPO overlong loss mask.

A filter decides per group unless registered `whole_batch=True` (it compares across the round, e.g.
DARTS's length relative to the round's longest completion): then the learner does not stream groups
as they arrive, since a piece of a round would be filtered differently from the whole round."""
from typing import Literal

import torch
from torch import Tensor

from upslope.batch import Batch
from upslope.bounds import NonNegative
from upslope.errors import ConfigError
from upslope.registry import FILTERS


def _group_any(flag: Tensor, group_ids: Tensor) -> Tensor:
    """Per sample: does any sample of its group have `flag`?"""
    _, inv = torch.unique(group_ids, return_inverse=True)
    hit = torch.zeros(int(inv.max().item()) + 1 if inv.numel() else 0, dtype=torch.long, device=flag.device)
    hit.index_add_(0, inv, flag.long())
    return hit[inv] > 0


@FILTERS.register("nonzero_std")
def nonzero_std(batch: Batch, *, tol: NonNegative = 0.0) -> Tensor:
    """DAPO dynamic sampling: keep groups whose rewards are not all equal (max - min > tol); they carry no signal.

    tol: keep a group only if its max - min reward exceeds this (>= 0; 0: any difference)

    A group of one sample is dropped too (verl's DAPO recipe keeps it): under the grouped estimators'
    default `singleton="zero"` its advantage is 0 (docs/methods.md, "Conventions").
    """
    if batch.rewards is None:
        raise ConfigError("filter 'nonzero_std' needs batch.rewards")
    r = batch.rewards.to(torch.float32)
    _, inv = torch.unique(batch.group_ids, return_inverse=True)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    hi = torch.full((g,), -torch.inf, device=r.device).scatter_reduce(0, inv, r, "amax")
    lo = torch.full((g,), torch.inf, device=r.device).scatter_reduce(0, inv, r, "amin")
    return (hi - lo)[inv] > tol


@FILTERS.register("max_length")
def max_length(batch: Batch, *, scope: Literal["group", "sample"] = "group") -> Tensor:
    """Drop truncated completions (hit max_new_tokens): the whole group (scope="group") or just the sample.

    scope: for a truncated completion drop its whole group ("group") or only that sample ("sample")
    """
    trunc = batch.truncated.bool()
    return ~(_group_any(trunc, batch.group_ids) if scope == "group" else trunc)


def overlong_mask(batch: Batch) -> Tensor:
    """DAPO overlong filtering: batch.loss_mask with truncated completions zeroed (they train on nothing)."""
    return torch.where(batch.truncated.bool()[:, None], torch.zeros_like(batch.loss_mask), batch.loss_mask)
