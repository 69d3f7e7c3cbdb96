"""Advantage estimators: `fn(batch, *, options) -> Tensor[N, L]`, exactly 0 where loss_mask is 0.

Traits are declared at registration and read by the loop (never by name): `grouped=True`
estimators compare a prompt's completions (rollout.n >= 2); a `critic=True` estimator
needs `batch.values` and returns `(advantages [N, L], returns [N, L])`, computed once; a
`whole_batch=True` estimator uses statistics of the whole batch (e.g. whitening over its
tokens), so the learner waits for the whole batch instead of streaming groups as they arrive; a
`token_rewards=True` estimator reads `batch.token_rewards` when set (rewards placed on tokens).
Group statistics are float64 and a group whose rewards are all equal gets exactly 0
(`common.group_moments`); conventions (std, eps, singleton groups, returns across masked
spans) are options, defaults and reasons in docs/methods.md, "Conventions".
No `from __future__ import annotations` here: the registry validates options against
real (not string) annotations.
"""
import torch
from torch import Tensor

from upslope.algos.common import (Singleton, broadcast_to_tokens, group_moments, group_normalize,
                                  last_token_rewards, masked_whiten, reward_to_go)
from upslope.algos.combiners import group_normalized_sum, weighted_sum
from upslope.batch import Batch
from upslope.bounds import Fraction, NonNegative
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def _rewards(batch: Batch, who: str) -> Tensor:
    """batch.rewards in float64 (statistics are float64; estimators return float32)."""
    if batch.rewards is None:
        raise ConfigError(f"advantage '{who}' needs batch.rewards (score the batch first)")
    return batch.rewards.to(torch.float64)


def _tokens(per_sample: Tensor, batch: Batch) -> Tensor:
    """A float64 per-sample advantage [N] as float32 on the sample's trained tokens [N, L]."""
    return broadcast_to_tokens(per_sample.to(torch.float32), batch.loss_mask)


@ADVANTAGES.register("grpo", grouped=True)
def grpo(batch: Batch, *, scale_by_std: bool = True, eps: NonNegative = 1e-6, unbiased: bool = True,
         eps_in_sqrt: bool = False, singleton: Singleton = "zero") -> Tensor:
    """GRPO: (r - group mean) / (group std + eps), broadcast to the sample's tokens; 0 for a tied group.

    scale_by_std: divide by the group std (true) or only subtract the group mean (false)
    eps: added to the group std before dividing (>= 0)
    unbiased: group std with n - 1 (true) or the population n (false)
    eps_in_sqrt: divide by sqrt(var + eps) instead of (std + eps)
    singleton: a one-sample group gets 0 ("zero") or its raw reward ("raw", as verl)
    """
    adv = group_normalize(_rewards(batch, "grpo"), batch.group_ids, scale_by_std=scale_by_std, eps=eps,
                          unbiased=unbiased, eps_in_sqrt=eps_in_sqrt, singleton=singleton)
    return _tokens(adv, batch)


@ADVANTAGES.register("group_rank", grouped=True)
def group_rank(batch: Batch) -> Tensor:
    """Rank-based reward shaping (OPT*): a sample's advantage is its reward's rank in its group mapped evenly
    onto [-1, 1] (the best +1, the worst -1, ties share their mean rank), so a better answer always gets more
    than a worse one however close their rewards; 0 for a tied group or a group of one.
    """
    r = _rewards(batch, "group_rank")
    adv = torch.zeros_like(r)
    for g in batch.group_ids.unique():
        idx = torch.nonzero(batch.group_ids == g).flatten()
        v = r[idx]
        if len(idx) < 2:
            continue
        below = (v[None, :] < v[:, None]).sum(1).to(torch.float64)
        ties = (v[None, :] == v[:, None]).sum(1).to(torch.float64)
        adv[idx] = 2 * (below + (ties - 1) / 2) / (len(idx) - 1) - 1
    return _tokens(adv, batch)


@ADVANTAGES.register("dr_grpo", grouped=True)
def dr_grpo(batch: Batch, *, singleton: Singleton = "zero") -> Tensor:
    """Dr. GRPO: r - group mean (no std division, which biases toward easy/hard prompts).

    singleton: a one-sample group gets 0 ("zero") or its raw reward ("raw", as verl)
    """
    adv = group_normalize(_rewards(batch, "dr_grpo"), batch.group_ids, scale_by_std=False, singleton=singleton)
    return _tokens(adv, batch)


@ADVANTAGES.register("rloo", grouped=True)
def rloo(batch: Batch, *, singleton: Singleton = "zero") -> Tensor:
    """RLOO: r_i - mean of the other samples of its group (unbiased baseline); 0 for a tied group.

    singleton: a one-sample group gets 0 ("zero") or its raw reward ("raw", as verl)
    """
    r = _rewards(batch, "rloo")
    mean, _, count, tied = group_moments(r, batch.group_ids)
    others = (mean * count - r) / (count - 1).clamp(min=1)
    adv = torch.where(tied, torch.zeros_like(r), r - others)
    if singleton == "raw":
        adv = torch.where(count == 1, r, adv)
    return _tokens(adv, batch)


@ADVANTAGES.register("reinforce_pp", whole_batch=True, token_rewards=True)
def reinforce_pp(batch: Batch, *, group_baseline: bool = False, gamma: Fraction = 1.0, eps: NonNegative = 1e-6,
                 unbiased: bool = False, eps_in_sqrt: bool = False, reset_at_masked: bool = False,
                 singleton: Singleton = "zero") -> Tensor:
    """REINFORCE++: reward-to-go (minus the group mean reward if group_baseline), whitened over all batch tokens.

    group_baseline: subtract the group mean reward, then only divide by the batch std (REINFORCE++-baseline)
    gamma: discount per trained token of the reward-to-go (0..1; 1: undiscounted)
    eps: added to the batch std before dividing (>= 0)
    unbiased: batch std with n - 1 (true) or the population n (false)
    eps_in_sqrt: divide by sqrt(var + eps) instead of (std + eps)
    reset_at_masked: restart the return at mask-0 positions in a row (verl) instead of carrying it across
    singleton: with group_baseline, a one-sample group gets 0 ("zero") or baseline 0 ("raw", as verl)

    The per-token return is the discounted reward-to-go of `batch.token_rewards` (e.g. with
    a KL penalty folded in), or of the outcome reward on the last token if that is None,
    which with gamma = 1 is r on every token. `group_baseline=True` is "REINFORCE++-baseline":
    the group mean is the baseline, so the batch step only divides by the batch std (no
    re-centring, which would move a tied group off 0; verl re-centres) and a tied group is
    exactly 0; a singleton group's baseline is its own reward (`"zero"`) or 0 (`"raw"`, verl).
    The return is carried across mask-0 spans inside a row unless `reset_at_masked` (verl).
    """
    r = _rewards(batch, "reinforce_pp")
    mask = batch.loss_mask
    tok = batch.token_rewards if batch.token_rewards is not None else last_token_rewards(r, mask)
    ret = reward_to_go(tok.to(torch.float64), mask, gamma, reset_at_masked=reset_at_masked)
    if not group_baseline:
        return masked_whiten(ret, mask, eps=eps, unbiased=unbiased, eps_in_sqrt=eps_in_sqrt).float()
    mean, _, count, tied = group_moments(r, batch.group_ids)
    if singleton == "raw":
        mean = torch.where(count == 1, torch.zeros_like(mean), mean)
        tied = tied & (count > 1)
    adv = masked_whiten(ret - mean[:, None], mask, eps=eps, shift_mean=False, unbiased=unbiased,
                        eps_in_sqrt=eps_in_sqrt)
    return torch.where(tied[:, None], torch.zeros_like(adv), adv).float()


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


@ADVANTAGES.register("gae", critic=True, whole_batch=True, token_rewards=True)
def gae(batch: Batch, *, gamma: Fraction = 1.0, lam: Fraction = 0.95, whiten: bool = True, eps: NonNegative = 1e-6,
        unbiased: bool = False, eps_in_sqrt: bool = False) -> tuple[Tensor, Tensor]:
    """PPO with a critic: (GAE(gamma, lam) advantages, returns) from batch.values and token rewards.

    gamma: discount per trained token (0..1; 1: undiscounted)
    lam: GAE lambda (0..1): 0 is one-step TD, 1 the full return minus the value
    whiten: whiten the advantages over the batch's trained tokens (returns are taken before)
    eps: added to the batch std when whitening (>= 0)
    unbiased: whitening std with n - 1 (true) or the population n (false)
    eps_in_sqrt: when whitening, divide by sqrt(var + eps) instead of (std + eps)

    Token rewards default to the outcome reward on the last trained token. Returns are
    advantages + values from the un-whitened advantages (the critic's regression target);
    the advantages are then whitened over the batch's trained tokens if `whiten`.
    """
    if batch.values is None:
        raise ConfigError("advantage 'gae' needs batch.values (run the critic first)")
    mask = batch.loss_mask
    tok = batch.token_rewards if batch.token_rewards is not None else last_token_rewards(_rewards(batch, "gae"), mask)
    adv, returns = gae_advantages_and_returns(tok, batch.values, mask, gamma, lam)
    if whiten:
        adv = masked_whiten(adv, mask, eps=eps, unbiased=unbiased, eps_in_sqrt=eps_in_sqrt)
    return adv.float(), returns.float()


@ADVANTAGES.register("gdpo", grouped=True, whole_batch=True)
def gdpo(batch: Batch, *, weights: dict[str, float] | None = None, batch_normalize: bool = True,
         eps: NonNegative = 1e-6, unbiased: bool = True, batch_unbiased: bool = False, eps_in_sqrt: bool = False,
         singleton: Singleton = "zero") -> Tensor:
    """GDPO: normalise each reward component within its group, weighted-sum, then (optionally) normalise over the batch.

    weights: weight per reward component name (unlisted weigh 1.0; an unknown name is an error)
    batch_normalize: after the weighted sum, normalise by mean and std over the batch's N samples
    eps: added to each std before dividing, group and batch (>= 0)
    unbiased: per-component group std with n - 1 (true) or the population n (false)
    batch_unbiased: batch std with n - 1 (true) or the population n (false)
    eps_in_sqrt: divide by sqrt(var + eps) instead of (std + eps) (group and batch)
    singleton: a one-sample group gets 0 ("zero") or its raw component values ("raw", as verl)

    Decoupling stops a high-variance component from drowning the others. Batch
    normalisation uses the mean/std (population unless `batch_unbiased`) over the N samples
    (not tokens); a group tied on every component stays at exactly 0 through it.
    """
    if not batch.reward_components:
        raise ConfigError("advantage 'gdpo' needs batch.reward_components (several named rewards)")
    comps = {k: v.to(torch.float64) for k, v in batch.reward_components.items()}
    adv = group_normalized_sum(comps, batch.group_ids, weights=weights, eps=eps, unbiased=unbiased,
                               eps_in_sqrt=eps_in_sqrt, singleton=singleton)
    if batch_normalize and adv.numel() > 1:
        tied = torch.stack([group_moments(v, batch.group_ids)[3] for v in comps.values()]).all(dim=0)
        if singleton == "raw":
            tied &= group_moments(adv, batch.group_ids)[2] > 1
        ones = torch.ones_like(adv)
        adv = masked_whiten(adv, ones, eps=eps, unbiased=batch_unbiased, eps_in_sqrt=eps_in_sqrt)
        adv = torch.where(tied, torch.zeros_like(adv), adv)
    return _tokens(adv, batch)


def _components(batch: Batch, who: str) -> dict[str, Tensor]:
    """batch.reward_components in float64; a ConfigError if the batch has none."""
    if not batch.reward_components:
        raise ConfigError(f"advantage '{who}' needs batch.reward_components (several named rewards)")
    return {k: v.to(torch.float64) for k, v in batch.reward_components.items()}


def reward_cancellation(comps: dict[str, Tensor], group_ids: Tensor, weights: dict[str, float] | None, *,
                        eps: float = 1e-6, unbiased: bool = True) -> Tensor:
    """[N] in [0, 1]: 1 - |sum_k w_k a_k| / sum_k |w_k a_k| over the group-normalised components a_k.

    0 when every component pushes the rollout the same way, 1 when they cancel exactly; 0 for
    a rollout with no component advantage at all.
    """
    w = {k: float((weights or {}).get(k, 1.0)) for k in comps}
    parts = [w[k] * group_normalize(v, group_ids, eps=eps, unbiased=unbiased).to(torch.float64)
             for k, v in comps.items()]
    total, mass = sum(parts).abs(), sum(p.abs() for p in parts)
    return torch.where(mass > 0, 1 - total / mass.clamp(min=1e-300), torch.zeros_like(mass))


@ADVANTAGES.register("gd2po", grouped=True, whole_batch=True)
def gd2po(batch: Batch, *, weights: dict[str, float] | None = None, threshold: Fraction = 0.5, reweight: bool = True,
          batch_normalize: bool = True, eps: NonNegative = 1e-6, unbiased: bool = True) -> Tensor:
    """GD2PO (Liu et al. 2026): GDPO's advantage with conflicted rollouts masked and queries reweighted by consensus.

    weights: weight per reward component name (unlisted weigh 1.0; an unknown name is an error)
    threshold: mask a rollout whose component cancellation 1 - |sum w a| / sum |w a| exceeds this (0..1)
    reweight: scale each query's advantages by its mean consensus (1 - cancellation) over the batch mean
    batch_normalize: GDPO's batch normalisation of the summed advantage before masking
    eps: added to each std before dividing (>= 0)
    unbiased: per-component group std with n - 1 (true) or the population n (false)

    The abstract does not define "severe disagreement" or the query weight; the cancellation
    measure, its threshold 0.5 (the minority components carry over a third of the majority's
    magnitude) and the consensus weight (mean 1 over the batch's queries) are our choices.
    """
    if not 0 <= threshold <= 1:
        raise ConfigError(f"gd2po threshold must be in [0, 1] (got {threshold})")
    comps = _components(batch, "gd2po")
    adv = gdpo(batch, weights=weights, batch_normalize=batch_normalize, eps=eps, unbiased=unbiased)
    cancel = reward_cancellation(comps, batch.group_ids, weights, eps=eps, unbiased=unbiased)
    factor = (cancel <= threshold).to(torch.float64)
    if reweight:
        consensus, _, count, _ = group_moments(1 - cancel, batch.group_ids)
        per_query = (consensus / count).sum()  # each group's mean consensus, summed once per group
        n_groups = (1 / count).sum()
        if per_query > 0:
            factor = factor * consensus / (per_query / n_groups)
    return adv * factor.to(adv.dtype)[:, None]


@ADVANTAGES.register("recal", grouped=True, whole_batch=True)
def recal(batch: Batch, *, weights: dict[str, float] | None = None, dataset_key: str = "dataset",
          variance_power: NonNegative = 0.5, eps: NonNegative = 1e-6, unbiased: bool = True) -> Tensor:
    """ReCal (Yu et al. 2026): component-wise group advantages, variance-aware query weights, then unit std per dataset.

    weights: weight per reward component name (unlisted weigh 1.0; an unknown name is an error)
    dataset_key: the example field naming its dataset (samples without it form one dataset)
    variance_power: a query's weight is (its reward std / the batch's mean query std) ** this (0: off)
    eps: added to each std before dividing, group and dataset (>= 0)
    unbiased: per-component group std with n - 1 (true) or the population n (false)

    Per-component normalisation is GDPO's. The group std division then gives a near-trivial
    group (one failure in eight) as large an update as an informative one (pass rate 1/2);
    the variance-aware weight, on the population std of the group's weighted reward sum,
    calibrates that back (power 1 undoes the division, 0.5 halves it in log scale). Last,
    each dataset's summed advantages are divided by their population std over its samples
    (no re-centring: the group advantages are already centred; a tied group stays 0), so a
    dataset with large or noisy rewards does not dominate. The abstract gives neither
    weight's form: the power law, its default and the order are our choices.
    """
    comps = batch.reward_components or {"reward": _rewards(batch, "recal")}
    comps = {k: v.to(torch.float64) for k, v in comps.items()}
    adv = group_normalized_sum(comps, batch.group_ids, weights=weights, eps=eps, unbiased=unbiased).to(torch.float64)
    if variance_power:
        raw = weighted_sum(comps, batch.group_ids, weights=weights).to(torch.float64)
        _, var, count, tied = group_moments(raw, batch.group_ids, unbiased=False)
        std = var.sqrt()
        mean_std = (std / count)[~tied].sum() / (1 / count)[~tied].sum() if bool((~tied).any()) else std.new_ones(())
        adv = torch.where(tied, torch.zeros_like(adv), adv * (std / mean_std).clamp(min=1e-12) ** variance_power)
    labels = [str(m.get(dataset_key, "")) for m in batch.meta] if batch.meta else [""] * adv.numel()
    index = {name: i for i, name in enumerate(sorted(set(labels)))}
    dataset_ids = torch.tensor([index[x] for x in labels], dtype=torch.long, device=adv.device)
    _, var, _, tied = group_moments(adv, dataset_ids, unbiased=False)
    scaled = torch.where(tied, torch.zeros_like(adv), adv / (var.sqrt() + eps))
    return _tokens(scaled, batch)
