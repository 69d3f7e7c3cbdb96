"""Preference-pair batches: each pair is a group of two rows of the one Batch, its chosen and its
rejected completion after the same prompt (so the shared-prompt forward runs the prompt
once per pair). The row with the higher `rewards` value is the chosen one: dataset pairs
get 1 and 0, on-policy pairs keep their real rewards (chosen > rejected by construction)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from upslope.algos.preference import PairLogps, PairRewards
from upslope.batch import Batch, build_batch
from upslope.errors import UpslopeError


def pair_batch(prompt_ids: Sequence[list[int]], chosen_ids: Sequence[list[int]], rejected_ids: Sequence[list[int]],
               pair_ids: Sequence[int], pad_id: int) -> Batch:
    """A Batch of pairs: rows 2k (chosen, reward 1) and 2k+1 (rejected, reward 0) form group pair_ids[k]."""
    prompts = [p for p in prompt_ids for _ in range(2)]
    replies = [r for pair in zip(chosen_ids, rejected_ids) for r in pair]
    groups = [g for g in pair_ids for _ in range(2)]
    meta = [{"pair": g, "chosen": i % 2 == 0} for i, g in enumerate(groups)]
    batch = build_batch(prompts, replies, [[0.0] * len(r) for r in replies], groups, [False] * len(replies), pad_id,
                        meta=meta)
    return replace(batch, rewards=torch.tensor([1.0, 0.0] * len(pair_ids)))


def best_worst_pairs(batch: Batch) -> Batch:
    """From groups of sampled completions with rewards, one pair per group whose rewards differ:
    the group's first best and first worst completion (groups with equal rewards give none)."""
    assert batch.rewards is not None
    rows: list[int] = []
    for g in batch.group_ids.unique():
        idx = torch.nonzero(batch.group_ids == g).flatten()
        r = batch.rewards[idx]
        if bool(r.max() > r.min()):
            rows += [int(idx[torch.argmax(r)]), int(idx[torch.argmin(r)])]
    return batch.select(rows)


def pair_rows(group_ids: torch.Tensor, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices of each pair's chosen and rejected completion, pairs in group-id order. Every
    group must be two rows with different rewards (a pair split across micro-batches is not)."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    if bool((counts != 2).any()):
        raise UpslopeError("preference batch: every pair must be one group of exactly two rows (chosen, rejected) "
                           "in the same micro-batch")
    order = torch.argsort(-rewards, stable=True)
    order = order[torch.argsort(inv[order], stable=True)]
    chosen, rejected = order[0::2], order[1::2]
    if not bool((rewards[chosen] > rewards[rejected]).all()):
        raise UpslopeError("preference batch: a pair's two rows have equal rewards, so neither is the chosen one")
    return chosen, rejected


def sequence_logps(token_logps: torch.Tensor, batch: Batch) -> PairLogps:
    """Each pair's summed log-probs (token log-probs x loss_mask) and token counts, chosen and rejected."""
    assert batch.rewards is not None
    chosen, rejected = pair_rows(batch.group_ids, batch.rewards)
    mask = batch.loss_mask
    seq = (token_logps * mask).sum(1)
    tokens = mask.sum(1)
    return PairLogps(seq[chosen], seq[rejected], tokens[chosen], tokens[rejected])


def pair_rewards(batch: Batch) -> PairRewards:
    """Each pair's chosen and rejected reward, pairs in the order of `sequence_logps`."""
    assert batch.rewards is not None
    chosen, rejected = pair_rows(batch.group_ids, batch.rewards)
    return PairRewards(batch.rewards[chosen], batch.rewards[rejected])


def completion_values(batch: Batch, values: Sequence[torch.Tensor]) -> torch.Tensor:
    """[N, L] with row i's completion tokens holding values[i] (one value per completion token), 0 elsewhere."""
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    for i, v in enumerate(values):
        start = int(batch.prompt_lens[i])
        if start + len(v) != int(batch.seq_lens[i]):
            raise ValueError(f"row {i}: {len(v)} values for {int(batch.seq_lens[i]) - start} completion tokens")
        out[i, start:start + len(v)] = v
    return out


def completion_slices(token_values: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
    """The inverse of `completion_values`: each row's values at its completion tokens."""
    return [token_values[i, int(batch.prompt_lens[i]):int(batch.seq_lens[i])].clone() for i in range(batch.size)]
