"""Advantage estimators: `fn(batch, *, options) -> Tensor[N, L]`, exactly 0 where loss_mask is 0.

Group-based estimators (grpo, dr_grpo, rloo, gdpo) use `common.group_stats`. The group
std is the *sample* std (Bessel's n - 1, the same as torch.std, verl and TRL) so
recipe numbers carry over; a group of one sample gets advantage 0.
No `from __future__ import annotations` here: the registry validates options against
real (not string) annotations.
"""
import torch
from torch import Tensor

from upslope.algos.common import (broadcast_to_tokens, group_normalize, group_stats, last_token_rewards,
                                  masked_whiten, reward_to_go)
from upslope.algos.combiners import group_normalized_sum
from upslope.batch import Batch
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def _rewards(batch: Batch, who: str) -> Tensor:
    if batch.rewards is None:
        raise ConfigError(f"advantage '{who}' needs batch.rewards (score the batch first)")
    return batch.rewards.to(torch.float32)


@ADVANTAGES.register("grpo")
def grpo(batch: Batch, *, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO: (r - group mean) / (group sample std + eps), broadcast to the sample's tokens."""
    adv = group_normalize(_rewards(batch, "grpo"), batch.group_ids, scale_by_std=scale_by_std, eps=eps)
    return broadcast_to_tokens(adv, batch.loss_mask)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(batch: Batch) -> Tensor:
    """Dr. GRPO: r - group mean (no std division, which biases toward easy/hard prompts)."""
    adv = group_normalize(_rewards(batch, "dr_grpo"), batch.group_ids, scale_by_std=False)
    return broadcast_to_tokens(adv, batch.loss_mask)


@ADVANTAGES.register("rloo")
def rloo(batch: Batch) -> Tensor:
    """RLOO: r_i - mean of the other samples of its group (unbiased baseline); 0 for singleton groups."""
    r = _rewards(batch, "rloo")
    mean, _, count = group_stats(r, batch.group_ids)
    others = (mean * count - r) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, r - others, torch.zeros_like(r))
    return broadcast_to_tokens(adv, batch.loss_mask)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(batch: Batch, *, group_baseline: bool = False, gamma: float = 1.0, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: reward-to-go (minus the group mean reward if group_baseline), whitened over all batch tokens.

    The per-token return is the discounted reward-to-go of `batch.token_rewards` (e.g. with
    a KL penalty folded in), or of the outcome reward on the last token if that is None,
    which with gamma = 1 is r on every token. `group_baseline=True` is "REINFORCE++-baseline".
    """
    r = _rewards(batch, "reinforce_pp")
    mask = batch.loss_mask
    tok = batch.token_rewards if batch.token_rewards is not None else last_token_rewards(r, mask)
    ret = reward_to_go(tok.to(torch.float32), mask, gamma)
    if group_baseline:
        mean, _, _ = group_stats(r, batch.group_ids)
        ret = ret - mean[:, None]
    return masked_whiten(ret, mask, eps=eps)


def gae_advantages_and_returns(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float,
                               lam: float) -> tuple[Tensor, Tensor]:
    """GAE over the mask > 0 tokens of each row: (advantages, returns = advantages + values), 0 off-mask.

    `values[i, t]` is V of the state in which token t is chosen. Positions with mask 0
    (prompt, padding, tool output inside a multi-turn completion) are skipped: the next
    state of a trained token is the next *trained* token; after the last one V = 0. Token
    rewards at mask-0 positions are ignored.
    """
    valid = mask > 0
    r = token_rewards.to(torch.float32)
    v = values.detach().to(torch.float32)
    adv = torch.zeros_like(r)
    next_v = torch.zeros_like(r[:, 0])
    next_gae = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):  # positions, vectorised over rows
        m = valid[:, t]
        delta = r[:, t] + gamma * next_v - v[:, t]
        gae_t = delta + gamma * lam * next_gae
        adv[:, t] = torch.where(m, gae_t, torch.zeros_like(gae_t))
        next_v = torch.where(m, v[:, t], next_v)
        next_gae = torch.where(m, gae_t, next_gae)
    returns = torch.where(valid, adv + v, torch.zeros_like(adv))
    return adv, returns


@ADVANTAGES.register("gae")
def gae(batch: Batch, *, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True, eps: float = 1e-6) -> Tensor:
    """PPO with a critic: GAE(gamma, lam) from batch.values and token rewards (outcome on the last token if None).

    Returns only advantages; the learner sets `batch.returns` with `gae_advantages_and_returns`
    (returns are computed from the un-whitened advantages).
    """
    if batch.values is None:
        raise ConfigError("advantage 'gae' needs batch.values (run the critic first)")
    mask = batch.loss_mask
    tok = batch.token_rewards if batch.token_rewards is not None else last_token_rewards(_rewards(batch, "gae"), mask)
    adv, _ = gae_advantages_and_returns(tok, batch.values, mask, gamma, lam)
    return masked_whiten(adv, mask, eps=eps) if whiten else adv


@ADVANTAGES.register("gdpo")
def gdpo(batch: Batch, *, weights: dict[str, float] | None = None, batch_normalize: bool = True,
         eps: float = 1e-6) -> Tensor:
    """GDPO: normalise each reward component within its group, weighted-sum, then (optionally) normalise over the batch.

    Decoupling stops a high-variance component from drowning the others. Batch
    normalisation uses the population mean/std over the N samples (not tokens).
    """
    if not batch.reward_components:
        raise ConfigError("advantage 'gdpo' needs batch.reward_components (several named rewards)")
    adv = group_normalized_sum(batch.reward_components, batch.group_ids, weights=weights, eps=eps)
    if batch_normalize and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + eps)
    return broadcast_to_tokens(adv, batch.loss_mask)
