"""Synthetic RL batches shared by learner tests (imported by module name: tests/ is on sys.path,
and spawned learner ranks inherit it)."""
from __future__ import annotations

import torch

from upslope.batch import Batch, build_batch


def grouped_rl_batch(advantages_per_group: list[float], n: int = 3, seed: int = 0, length_cycle: int = 4) -> Batch:
    """Groups of `n` rows; group g's prompt is shared by its rows and its rows get advantages
    +a, -a, 0 ... (a group with a = 0 has no signal). Lengths vary so micro-batches differ."""
    gen = torch.Generator().manual_seed(seed)
    prompts, comps, gids = [], [], []
    for g, _ in enumerate(advantages_per_group):
        prompt = torch.randint(5, 400, (3 + g % 3,), generator=gen).tolist()
        for i in range(n):
            prompts.append(prompt)
            comps.append(torch.randint(5, 400, (2 + (g + i) % length_cycle,), generator=gen).tolist())
            gids.append(g)
    b = build_batch(prompts, comps, [[-1.0] * len(c) for c in comps], gids, [False] * len(comps), pad_id=0)
    signs = torch.tensor([1.0, -1.0] + [0.0] * (n - 2))
    row_adv = torch.cat([a * signs for a in advantages_per_group])
    b.advantages = row_adv[:, None] * b.loss_mask
    return b


def score_and_check(batch: Batch, reward_fns, combiner, fallback: float = 0.0, tokenizer=None) -> tuple[Batch, dict]:
    """The reward stage as a training round runs it on one piece: score, then the strict check
    (a reward failing on every sample is an error); the scored batch and its metrics."""
    from upslope.train.stages import check_reward_failures, score_batch

    out, metrics, errors = score_batch(batch, reward_fns, combiner, fallback, tokenizer)
    check_reward_failures(metrics, errors, out.size)
    return out, metrics
