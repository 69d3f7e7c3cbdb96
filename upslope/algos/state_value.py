"""State values from the returns of other rollouts of the same prompt (Chen et al. 2026, *Hista and Numca:
Estimate State Value Effectively for LLM Reinforcement Learning*): the value of a state is a weighted
average of the other rollouts' returns. Hista weighs them by how alike the rollouts' hidden states are
(the advantage `hista` here); Numca by whether they reached the same numeric milestone (the reward `numca`,
upslope.rewards.milestones, which uses `others_value`)."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import per_position_inputs, group_moments, std_denominator
from upslope.batch import Batch
from upslope.bounds import NonNegative, Positive
from upslope.registry import ADVANTAGES


def others_value(returns: Tensor, weights: Tensor, fallback: Tensor | float) -> Tensor:
    """[...]: the weighted mean of the other rollouts' `returns` [M] under `weights` [..., M] (>= 0), and
    `fallback` where the weights sum to 0 (no other rollout informs the state)."""
    total = weights.to(torch.float64).sum(-1)
    mean = (weights.to(torch.float64) @ returns.to(torch.float64)) / total.clamp(min=1e-300)
    return torch.where(total > 0, mean, torch.as_tensor(fallback, dtype=torch.float64))


def choosing_states(states: Tensor) -> Tensor:
    """[N, L, D]: at t the hidden state at t - 1, the one that chooses token t (0 at t = 0)."""
    return torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)


def hista_values(states: Tensor, mask: Tensor, returns: Tensor, group_ids: Tensor, temperature: float) -> Tensor:
    """[N, L]: the value of the state that chooses each trained token, the returns of the other rollouts of
    its prompt averaged with weights softmax_j(cos(state, mean state of rollout j) / temperature); a
    rollout alone in its group is its own value."""
    s = choosing_states(states.to(torch.float64))
    on = (mask > 0).to(torch.float64)
    means = (s * on.unsqueeze(-1)).sum(1) / on.sum(1, keepdim=True).clamp(min=1.0)
    unit = s / s.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    unit_means = means / means.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    r = returns.to(torch.float64)
    values = r[:, None].expand(mask.shape).clone()
    for g in group_ids.unique():
        rows = torch.nonzero(group_ids == g).flatten()
        if rows.numel() < 2:
            continue
        logits = unit[rows] @ unit_means[rows].T / temperature  # [n, L, n]
        eye = torch.eye(rows.numel(), dtype=torch.bool)[:, None, :].expand_as(logits)
        weights = torch.softmax(logits.masked_fill(eye, float("-inf")), dim=-1)
        values[rows] = others_value(r[rows], weights, 0.0)
    return values * (mask > 0)


@ADVANTAGES.register("hista", grouped=True, features="hidden_states")
def hista(batch: Batch, features: Tensor | None = None, *, temperature: Positive = 0.1, scale_by_std: bool = True,
          eps: NonNegative = 1e-6) -> Tensor:
    """Hista: each token's advantage is its rollout's return minus the value of the state choosing it, the other
    rollouts' returns averaged with weights from hidden-state similarity.

    temperature: softmax temperature over cosines to the other rollouts' mean states (large: their plain mean, RLOO)
    scale_by_std: divide by the group's reward std (as GRPO)
    eps: added to that std before dividing

    Hista (Chen et al. 2026) uses the policy's hidden states as the representation by which disjoint rollouts
    and their returns are averaged into a state value. Here the state choosing token t is the last-layer hidden
    state at t - 1 (`hidden_states`: one forward of the decoder body); rollout j stands for its mean state over
    the states choosing its trained tokens; the weights are a softmax of cosines over the other rollouts of the
    same prompt (never the rollout itself): our choices. A tied group gets 0, as in GRPO.
    """
    r = per_position_inputs("hista", batch, features)
    values = hista_values(features, batch.loss_mask, r, batch.group_ids, temperature)
    _, var, _, tied = group_moments(r, batch.group_ids)
    adv = (r[:, None] - values) * (batch.loss_mask > 0)
    if scale_by_std:
        adv = adv / std_denominator(var, eps)[:, None]
    return torch.where(tied[:, None], torch.zeros_like(adv), adv).float()
