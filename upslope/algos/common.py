"""Tensor helpers shared by the algorithm plugins: group statistics, masked moments.

Every helper is vectorised over samples (scatter/index_add, no Python loop over rows).
Statistics are taken in float64, and a set of equal values (max == min) is treated as
exactly tied: its mean is that value and its variance 0, so it centres to exactly 0. In
float32 a group of eight 0.3 rewards would otherwise centre to ~3e-8, which eps 1e-6
amplifies to an advantage of 0.03 (and the row is then not skipped as zero-advantage).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from upslope.errors import ConfigError

if TYPE_CHECKING:
    from upslope.batch import Batch

Singleton = Literal["zero", "raw"]


def std_denominator(var: Tensor, eps: float, eps_in_sqrt: bool = False) -> Tensor:
    """The whitening denominator: sqrt(var) + eps (upslope, TRL), or sqrt(var + eps) (verl's masked_whiten)."""
    return (var + eps).sqrt() if eps_in_sqrt else var.sqrt() + eps


def group_moments(values: Tensor, group_ids: Tensor, *,
                  unbiased: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample float64 (group mean, group variance, group size, group tied) of `values [N]` by `group_ids [N]`.

    Two-pass (mean first, then squared deviations). `unbiased` divides by n - 1 (torch.std,
    verl, TRL; a group of one then has variance 0, not NaN), else by n (population). A
    tied group (max == min, singletons included) gets mean = its value and variance 0 exactly.
    """
    v = values.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    count = torch.zeros(g, dtype=v.dtype, device=v.device).index_add_(0, inv, torch.ones_like(v))
    mean = torch.zeros_like(count).index_add_(0, inv, v) / count
    hi = torch.full_like(count, -torch.inf).scatter_reduce_(0, inv, v, "amax")
    lo = torch.full_like(count, torch.inf).scatter_reduce_(0, inv, v, "amin")
    tied = hi == lo
    mean = torch.where(tied, lo, mean)
    ss = torch.zeros_like(count).index_add_(0, inv, (v - mean[inv]) ** 2)
    var = torch.where(tied, torch.zeros_like(ss), ss / ((count - 1).clamp(min=1) if unbiased else count))
    return mean[inv], var[inv], count[inv], tied[inv]


def group_stats(values: Tensor, group_ids: Tensor, *, unbiased: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, group std, group size) from `group_moments`, in the input's float dtype (>= float32)."""
    mean, var, count, _ = group_moments(values, group_ids, unbiased=unbiased)
    dt = torch.promote_types(values.dtype, torch.float32)
    return mean.to(dt), var.sqrt().to(dt), count.to(dt)


def group_normalize(values: Tensor, group_ids: Tensor, *, scale_by_std: bool = True, eps: float = 1e-6,
                    unbiased: bool = True, eps_in_sqrt: bool = False, singleton: Singleton = "zero") -> Tensor:
    """(v - group mean) / std_denominator(group var), or just v - group mean; exactly 0 for a tied group.

    Computed in float64, returned in the input's float dtype (float32 at least). A group of
    one sample gets 0 (`singleton="zero"`, upslope) or its raw value (`"raw"`, as verl).
    """
    out_dtype = torch.promote_types(values.dtype, torch.float32)
    mean, var, count, tied = group_moments(values, group_ids, unbiased=unbiased)
    v = values.to(torch.float64)
    centred = torch.where(tied, torch.zeros_like(v), v - mean)
    out = torch.where(tied, centred, centred / std_denominator(var, eps, eps_in_sqrt)) if scale_by_std else centred
    if singleton == "raw":
        out = torch.where(count == 1, v, out)
    return out.to(out_dtype)


MAX_LOG_RATIO = 20.0  # the bound every log-ratio to another policy is clamped to (exp(20) ~ 5e8)


def clamp_log_ratio(log_ratio: Tensor, bound: float | None) -> Tensor:
    """A log-ratio with NaN (inf - inf) as 0, clamped to +-bound (None: not clamped): never non-finite after exp."""
    x = torch.where(torch.isnan(log_ratio), torch.zeros_like(log_ratio), log_ratio)
    return x if bound is None else x.clamp(-bound, bound)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over positions where mask > 0 (0 when nothing is masked in)."""
    m = (mask > 0).to(x.dtype)
    x = torch.where(mask > 0, x, torch.zeros_like(x))
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-6, shift_mean: bool = True, unbiased: bool = False,
                  eps_in_sqrt: bool = False) -> Tensor:
    """(x - mean) / std_denominator(var) over the mask > 0 entries, in float64; 0 outside the mask.

    Population variance by default (`unbiased=True`: divide by n - 1, as verl). Equal values
    on every masked-in entry (max == min) whiten to exactly 0, not to rounding error / eps.
    Returned in x's float dtype (float32 at least).
    """
    out_dtype = torch.promote_types(x.dtype, torch.float32)
    valid = mask > 0
    v = torch.where(valid, x.to(torch.float64), torch.zeros((), dtype=torch.float64, device=x.device))
    n = valid.sum()
    if n == 0:
        return torch.zeros_like(v).to(out_dtype)
    on = v[valid]
    mean = on.sum() / n
    var = ((on - mean) ** 2).sum() / ((n - 1).clamp(min=1) if unbiased else n)
    if bool(on.max() == on.min()):
        return torch.zeros_like(v).to(out_dtype)
    out = ((v - mean) if shift_mean else v) / std_denominator(var, eps, eps_in_sqrt)
    return torch.where(valid, out, torch.zeros_like(out)).to(out_dtype)


def broadcast_to_tokens(per_sample: Tensor, mask: Tensor) -> Tensor:
    """A per-sample value [N] on every token where mask > 0, exactly 0 elsewhere: [N, L]."""
    full = per_sample.to(torch.float32 if not per_sample.is_floating_point() else per_sample.dtype)[:, None]
    return torch.where(mask > 0, full.expand(mask.shape), torch.zeros((), dtype=full.dtype, device=full.device))


def last_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Outcome rewards [N] placed on each row's last mask > 0 token: [N, L] (rows without one get 0)."""
    valid = mask > 0
    L = mask.shape[1]
    pos = torch.arange(L, device=mask.device).expand(mask.shape)
    last = torch.where(valid, pos, torch.full_like(pos, -1)).amax(dim=1)
    out = torch.zeros(mask.shape, dtype=torch.promote_types(rewards.dtype, torch.float32), device=mask.device)
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] = rewards[rows].to(out.dtype)
    return out


def reward_to_go(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0, *, reset_at_masked: bool = False) -> Tensor:
    """sum_{s >= t, mask_s} gamma^(k) r_s over the masked-in tokens (k counts masked-in steps); 0 off-mask.

    By default the return is carried across mask-0 spans inside a row (a tool output in a
    multi-turn completion), so an earlier turn is credited with the outcome reward at the end.
    `reset_at_masked=True` restarts it at every mask-0 position (verl's REINFORCE++), so each
    trained span only sees rewards inside itself.
    """
    valid = mask > 0
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):  # loop over positions, vectorised over rows
        v = valid[:, t]
        carried = running if not reset_at_masked else torch.where(v, running, torch.zeros_like(running))
        running = torch.where(v, token_rewards[:, t] + gamma * carried, carried)
        out[:, t] = torch.where(v, running, torch.zeros_like(running))
    return out


def per_position_inputs(name: str, batch: Batch, features: Tensor | None) -> Tensor:
    """The rewards of an advantage that reads each rollout's hidden state at every position ([N, L, D]
    `features`, from the RL trainer's `hidden_states` pass), as float64; one ConfigError line when either
    is missing."""
    if features is None or features.dim() != 3 or features.shape[:2] != batch.input_ids.shape:
        raise ConfigError(f"advantage '{name}' needs each rollout's hidden state at every position (the RL "
                          "trainer computes them)")
    if batch.rewards is None:
        raise ConfigError(f"advantage '{name}' needs batch.rewards (score the batch first)")
    return batch.rewards.to(torch.float64)
