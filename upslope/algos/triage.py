"""PivotTrace: the density of attention pivots in a prompt's rollouts measures the model's uncertainty on it,
and routes the prompt: confident ones train on a self-reward, moderately uncertain ones on their labels (the
ones worth annotating), the most uncertain ones are skipped. Registered with `salience="attention_shift"`:
the RL trainer runs one eager-attention forward and passes each token's shift of attention
(`upslope.train.learner.salience`)."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import Fraction, NonNegative, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def pivot_density(shift: Tensor, mask: Tensor, z: float) -> Tensor:
    """[N]: the share of each row's trained tokens whose attention shift is more than `z` (population)
    standard deviations above the row's mean shift; 0 for a row without trained tokens."""
    on = (mask > 0).to(torch.float64)
    s = shift.to(torch.float64) * on
    count = on.sum(1).clamp(min=1)
    mean = s.sum(1, keepdim=True) / count[:, None]
    std = ((((s - mean) * on) ** 2).sum(1, keepdim=True) / count[:, None]).sqrt()
    return ((s > mean + z * std) & (on > 0)).sum(1).to(torch.float64) / count


def triage(uncertainty: Tensor, low: float, high: float) -> Tensor:
    """[G] route of each prompt from its uncertainty's rank share among the batch's prompts ((rank + 0.5) / G,
    rank 0 the least uncertain, ties by order): 0 self-reward (share below `low`), 1 label (below `high`), 2 skip."""
    g = len(uncertainty)
    rank = torch.empty(g, dtype=torch.float64)
    rank[torch.argsort(uncertainty, stable=True)] = (torch.arange(g, dtype=torch.float64) + 0.5) / max(g, 1)
    return (rank >= low).long() + (rank >= high).long()


@ADVANTAGES.register("pivottrace", grouped=True, whole_batch=True, salience="attention_shift")
def pivottrace(batch: Batch, salience: Tensor | None = None, *, correct: str = "correct", self_reward: str = "self",
               low: Fraction = 0.33, high: Fraction = 0.67, z: NonNegative = 1.0,
               answer_tokens: PositiveCount = 1) -> Tensor:
    """PivotTrace: prompts routed by the pivot density of their rollouts' attention to self-reward, labels or no training.

    correct: the reward component of the verifier (read on the prompts routed to annotation only)
    self_reward: the reward component of the label-free self-reward (e.g. majority_vote)
    low: the least uncertain share of the batch's prompts trains on the self-reward
    high: the prompts between low and high train on their labels; the rest (the most uncertain) are skipped
    z: a token is a pivot when its attention shift is this many standard deviations above its rollout's mean
    answer_tokens: unused by PivotTrace's salience (kept for the shared salience interface)

    A token's attention shift is the total variation distance between its attention row and the previous
    token's (layers and heads averaged); a prompt's uncertainty is the mean pivot density of its rollouts.
    PivotTrace (Zhu et al. 2026) triages unlabelled data three ways by pivot density, traced from attention
    dynamics; the shift measure, the per-rollout z threshold, the batch-rank routing and which route gets
    which training signal are our choices. GRPO's advantage on the route's reward; skipped prompts get 0.
    """
    if salience is None:
        raise ConfigError("advantage 'pivottrace' needs the policy's attention shifts (the RL trainer computes them)")
    if not 0 <= low <= high <= 1:
        raise ConfigError(f"advantage 'pivottrace': need 0 <= low <= high <= 1 (got {low}, {high})")
    comps = batch.reward_components or {}
    missing = [k for k in (correct, self_reward) if k not in comps]
    if missing:
        raise ConfigError(f"advantage 'pivottrace': no reward component {missing} (components: {sorted(comps)}); "
                          f"name them with the options correct and self_reward")
    density = pivot_density(salience, batch.loss_mask, z)
    groups, inv = torch.unique(batch.group_ids, return_inverse=True)
    uncertainty = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, inv, density)
    uncertainty /= torch.zeros(len(groups), dtype=torch.float64).index_add_(0, inv, torch.ones_like(density))
    route = triage(uncertainty, low, high)[inv]
    reward = torch.where(route == 0, comps[self_reward].to(torch.float64), comps[correct].to(torch.float64))
    adv = group_normalize(reward, batch.group_ids).to(torch.float64) * (route < 2)
    return broadcast_to_tokens(adv, batch.loss_mask).float()
