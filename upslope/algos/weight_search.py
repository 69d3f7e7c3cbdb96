"""Consolidation rules of gradient-free weight search (`upslope randopt`): from the rewards of K
perturbed copies of the policy, theta + sigma d_k (d_k a unit Gaussian direction), to the
coefficients c_k of one update theta <- theta + sum_k c_k d_k.

Each rule is registered in CONSOLIDATORS as `fn(rewards, sigma, *, options) -> (c, metrics)`:
`rewards` is [K, P], perturbation k's mean reward on each of the step's P prompts (the same prompts,
sampled with the same seed, for every k)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from upslope.bounds import NonNegative, Positive, PositiveFraction
from upslope.registry import CONSOLIDATORS


def centered_ranks(x: Tensor) -> Tensor:
    """The ranks of `x` scaled to [-0.5, 0.5], ties sharing their mean rank (the fitness shaping of
    Salimans et al. 2017): invariant to any increasing transform of the rewards, and summing to 0."""
    x = x.double()
    if x.numel() < 2:
        return torch.zeros_like(x)
    less = (x[None, :] < x[:, None]).sum(1).double()
    equal = (x[None, :] == x[:, None]).sum(1).double()
    rank = less + (equal - 1) / 2  # 0 .. K-1
    return rank / (x.numel() - 1) - 0.5


def zscores(x: Tensor) -> Tensor:
    """(x - mean) / std (population std), 0 where every value is equal."""
    x = x.double()
    std = x.std(unbiased=False)
    return torch.zeros_like(x) if std == 0 else (x - x.mean()) / std


@CONSOLIDATORS.register("es")
def es(rewards: Tensor, sigma: float, *, lr: Positive = 1e-3, shaping: Literal["ranks", "zscore"] = "ranks",
       ) -> tuple[Tensor, dict[str, float]]:
    """Evolution strategies (Salimans et al. 2017, in the form Qiu et al. 2025 ran on LLMs): one step
    along the shaped-reward-weighted mean of the directions, c_k = lr x u_k / K, u the shaped mean rewards.

    lr: step size: the update is lr x sigma x the ES gradient estimate (RMS per weight about lr / 9 with ranks and 8 independent directions)
    shaping: ranks (centred ranks in [-0.5, 0.5]: only the order of the rewards counts) or zscore

    Equal rewards give u = 0 and no update; mirrored pairs with equal rewards cancel.
    """
    mean = rewards.double().mean(1)
    u = centered_ranks(mean) if shaping == "ranks" else zscores(mean)
    coef = lr * u / rewards.shape[0]
    return coef, {"es/shaped_abs_mean": float(u.abs().mean())}


def compatibility(gains: Tensor, weights: Tensor) -> Tensor:
    """Per kept perturbation (weight > 0): the cosine between its per-prompt gains and the weighted sum
    of the other kept perturbations' gains, clipped at 0 (COS_ZERO); 1 where there is nothing to compare with (a
    lone perturbation, or zero vectors)."""
    out = torch.ones_like(weights)
    kept = torch.nonzero(weights > 0).flatten().tolist()
    for k in kept:
        others = (weights[:, None] * gains).sum(0) - weights[k] * gains[k]
        norm = others.norm() * gains[k].norm()
        if len(kept) > 1 and norm > 0:
            cos = float(gains[k] @ others / norm)
            out[k] = cos if cos > COS_ZERO else 0.0
    return out


COS_ZERO = 1e-9  # cosines up to this count as 0: rounding must not turn an orthogonal perturbation into the update


@CONSOLIDATORS.register("corp")
def corp(rewards: Tensor, sigma: float, *, elite: PositiveFraction = 0.5, compat: NonNegative = 1.0,
         scale: Positive = 1.0,
         ) -> tuple[Tensor, dict[str, float]]:
    """CoRP (Zhang et al. 2026): fold the rewarded perturbations into one model: the best `elite` share,
    weighted by their gain over the population's mean reward times their compatibility, averaged; the
    update moves `scale` of the way to that weighted average of the kept perturbed models.

    elite: share of the population kept, the best by mean reward (at least one; only gains > 0 count)
    compat: exponent of the compatibility factor (0: off): the cosine of a perturbation's per-prompt gains with the other kept ones'
    scale: 1.0: the update lands on the weighted average of the kept perturbed models, theta + sigma sum_k w_k d_k

    The abstract names the parts (reward-weighted aggregation, compatibility-aware reweighting, a
    held-out validation gate: `randopt.gate_prompts`) but not their formulas; compatibility is measured
    here in behaviour space (per-prompt reward gains), where independent noise directions are not
    orthogonal by construction. No perturbation above the mean, or none compatible: no update.
    """
    r = rewards.double()
    k_total = r.shape[0]
    mean = r.mean(1)
    gain = mean - mean.mean()
    kept = sorted(range(k_total), key=lambda k: (-float(mean[k]), k))[:max(1, round(elite * k_total))]
    w = torch.zeros(k_total, dtype=torch.float64)
    tiny = COS_ZERO * max(1.0, float(r.abs().max()))  # a gain that is 0 up to rounding counts as 0
    w[kept] = torch.where(gain[kept] > tiny, gain[kept], torch.zeros_like(gain[kept]))
    c = compatibility(r - r.mean(0), w) if compat > 0 else torch.ones_like(w)
    w = w * c.pow(compat)
    total = w.sum()
    w = w / total if total > 0 else w
    shown = w > 0
    return scale * sigma * w, {"corp/kept": float(shown.sum()),
                               "corp/compat_mean": float(c[shown].mean()) if shown.any() else 0.0}
