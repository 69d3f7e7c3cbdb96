"""Tensor helpers shared by the algorithm plugins: group statistics, masked moments.

Every helper is vectorised over samples (scatter/index_add, no Python loop over rows).
"""
from __future__ import annotations

import torch
from torch import Tensor


def group_stats(values: Tensor, group_ids: Tensor, *, unbiased: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, group std, group size) of `values [N]`, by `group_ids [N]`.

    Two-pass (mean first, then squared deviations) for numerical stability. `unbiased`
    selects the sample std (divide by n - 1, as torch.std, verl and TRL do); a group of
    one sample then has std 0, not NaN. With `unbiased=False` it is the population std.
    """
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max().item()) + 1 if inv.numel() else 0
    count = torch.zeros(g, dtype=values.dtype, device=values.device).index_add_(0, inv, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, inv, values)
    mean = total / count
    dev2 = (values - mean[inv]) ** 2
    ss = torch.zeros_like(count).index_add_(0, inv, dev2)
    denom = (count - 1).clamp(min=1) if unbiased else count
    std = (ss / denom).sqrt()
    return mean[inv], std[inv], count[inv]


def group_normalize(values: Tensor, group_ids: Tensor, *, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """(v - group mean) / (group sample std + eps), or just v - group mean."""
    mean, std, _ = group_stats(values, group_ids)
    centred = values - mean
    return centred / (std + eps) if scale_by_std else centred


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over positions where mask > 0 (0 when nothing is masked in)."""
    m = (mask > 0).to(x.dtype)
    x = torch.where(mask > 0, x, torch.zeros_like(x))
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """(x - mean) / (std + eps) with population moments over mask > 0; 0 outside the mask."""
    valid = mask > 0
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) / (var.sqrt() + eps) if shift_mean else x / (var.sqrt() + eps)
    return torch.where(valid, out, torch.zeros_like(out))


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


def reward_to_go(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """sum_{s >= t, mask_s} gamma^(k) r_s over the masked tokens only (k counts masked steps); 0 off-mask."""
    valid = mask > 0
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):  # loop over positions, vectorised over rows
        v = valid[:, t]
        running = torch.where(v, token_rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(v, running, torch.zeros_like(running))
    return out
