"""Preference-pair batches: each pair is a group of two rows of the one Batch, its chosen and its
rejected completion after the same prompt (so the shared-prompt forward runs the prompt
once per pair). The row with the higher `rewards` value is the chosen one: dataset pairs
get 1 and 0, on-policy pairs keep their real rewards (chosen > rejected by construction)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from upslope.algos.preference import PairLogps, PairRewards
from upslope.algos.tree import sibling_sets, tree_nodes
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


def lookahead_step_pairs(batch: Batch) -> Batch:
    """PRISM's contrastive step pairs from tree rollouts (rollout `tree`), one pair per tree. A step is a node
    of the tree (its prefix: the prompt and the completion through the node's last token); its look-ahead
    value is the mean reward of the leaves under it. Among the siblings (steps from one parent) whose values
    differ, the chosen step is the best-valued sibling and the negative the likeliest sibling valued below it
    (highest mean sampler log-prob over its own tokens: a plausible step that the look-ahead shows fails); the
    tree's pair is the one with the likeliest negative. Rows carry the look-ahead values as rewards (chosen
    higher). Trees without a sibling difference give none."""
    assert batch.rewards is not None
    nodes = tree_nodes(batch, batch.rewards)

    def likelihood(n: int) -> float:
        row, p = nodes[n].row, int(batch.prompt_lens[nodes[n].row])
        span = batch.sampler_logprobs[row, p + nodes[n].start:p + nodes[n].end]
        return float(span.mean()) if span.numel() else float("-inf")

    best: dict[int, tuple[float, int, int]] = {}  # per tree: the likeliest negative's log-prob, chosen, negative
    for kids in sibling_sets(nodes):
        top = max(kids, key=lambda n: nodes[n].value)
        below = [n for n in kids if nodes[n].value < nodes[top].value]
        if below:
            neg = max(below, key=likelihood)
            g = nodes[top].group
            if g not in best or likelihood(neg) > best[g][0]:
                best[g] = (likelihood(neg), top, neg)
    rows, ends, values = [], [], []
    for _, top, neg in (best[g] for g in sorted(best)):
        for node in (nodes[top], nodes[neg]):
            rows.append(node.row)
            ends.append(int(batch.prompt_lens[node.row]) + node.end)
            values.append(node.value)
    out = batch.select(rows)
    if not rows:
        return out
    ends_t = torch.tensor(ends)
    within = torch.arange(out.input_ids.shape[1])[None, :] < ends_t[:, None]  # each step's prefix, the rest cut
    out = replace(out, attention_mask=out.attention_mask & within, loss_mask=out.loss_mask * within,
                  seq_lens=ends_t, truncated=torch.zeros(len(rows), dtype=torch.bool), rewards=torch.tensor(values),
                  reward_components={})
    return out.select(list(range(len(rows))))


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
