"""KL(pi || ref) per-token estimators from samples of pi, an adaptive KL coefficient, and KL-in-reward.

With log-ratio x = logprobs - ref_logprobs (tokens sampled from pi):
k1 = x (unbiased, high variance, can be negative); k2 = x^2 / 2 (biased, low variance;
its gradient is the true KL gradient on-policy); k3 = exp(-x) + x - 1 (unbiased, >= 0,
low variance; Schulman's estimator, "low_var_kl"). Signature: `fn(logprobs, ref_logprobs, *,
max_log_ratio) -> [N, L]`; mask the result (e.g. with `aggregate`) before use.
Every estimator clamps x to +-max_log_ratio (default 20, the policy losses' bound; verl
clamps k3's x at +-20 as well) and counts inf - inf as 0, so an extreme or infinite
log-ratio never yields a non-finite value or gradient (k3 = e^20 ~ 4.9e8 at the bound;
without it k3 overflows to inf past x ~ -88 in float32). Beyond the bound the gradient is 0.
"""
import math
from dataclasses import replace
from typing import Callable

import torch
from torch import Tensor

from upslope.algos.common import clamp_log_ratio, last_token_rewards
from upslope.batch import Batch
from upslope.bounds import Positive
from upslope.errors import ConfigError
from upslope.registry import KL_ESTIMATORS


def _log_ratio(logprobs: Tensor, ref_logprobs: Tensor, max_log_ratio: float) -> Tensor:
    """x = logprobs - ref_logprobs (ref detached), NaN (inf - inf) as 0, clamped to +-max_log_ratio."""
    if not max_log_ratio > 0:
        raise ConfigError(f"kl max_log_ratio must be > 0 (got {max_log_ratio})")
    return clamp_log_ratio(logprobs - ref_logprobs.detach(), max_log_ratio)


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor, *, max_log_ratio: Positive = 20.0) -> Tensor:
    """k1 = log pi - log ref: unbiased KL estimate, high variance, may be negative.

    max_log_ratio: clamp log pi - log ref to +-this before estimating (> 0; default 20)
    """
    return _log_ratio(logprobs, ref_logprobs, max_log_ratio)


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor, *, max_log_ratio: Positive = 20.0) -> Tensor:
    """k2 = (log pi - log ref)^2 / 2: low variance, slightly biased, non-negative.

    max_log_ratio: clamp log pi - log ref to +-this before estimating (> 0; default 20)
    """
    return 0.5 * _log_ratio(logprobs, ref_logprobs, max_log_ratio) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor, *, max_log_ratio: Positive = 20.0) -> Tensor:
    """k3 = exp(ref - lp) - (ref - lp) - 1: unbiased, low variance, always >= 0.

    max_log_ratio: clamp log pi - log ref to +-this before estimating (> 0; default 20)
    """
    d = -_log_ratio(logprobs, ref_logprobs, max_log_ratio)
    return (torch.expm1(d) - d).clamp(min=0)  # clamp: guard a rounding step below 0 at tiny d


def kl_in_reward(token_rewards: Tensor, kl: Tensor, beta: float, mask: Tensor) -> Tensor:
    """token_rewards - beta * kl on mask > 0 tokens (KL as a per-token reward penalty, PPO-RLHF style)."""
    penalty = torch.where(mask > 0, beta * kl.detach(), torch.zeros_like(kl))
    return token_rewards - penalty


def kl_penalty_in_reward(batch: Batch, kl_fn: Callable[..., torch.Tensor], beta: float) -> tuple[Batch, float]:
    """Fold -beta * KL(policy || reference) into the rewards: per token (token_rewards, for
    token-level estimators such as GAE) and summed per sequence (rewards, for group ones)."""
    assert batch.rewards is not None and batch.ref_logprobs is not None and batch.old_logprobs is not None
    kl = kl_fn(batch.old_logprobs, batch.ref_logprobs) * batch.loss_mask
    base = batch.token_rewards if batch.token_rewards is not None else last_token_rewards(batch.rewards,
                                                                                          batch.loss_mask)
    out = replace(batch, token_rewards=kl_in_reward(base, kl, beta, batch.loss_mask),
                  rewards=batch.rewards - beta * kl.sum(1))
    return out, float(kl.sum() / batch.loss_mask.sum().clamp(min=1))


class FixedKLController:
    """A constant KL coefficient (same interface as the adaptive one)."""

    def __init__(self, beta: float):
        self.value = float(beta)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value


class AdaptiveKLController:
    """Ziegler et al. (2019): beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon."""

    def __init__(self, init_beta: float, target: float, horizon: int):
        if target <= 0 or horizon <= 0:
            raise ConfigError(f"adaptive KL needs target > 0 and horizon > 0 (got {target}, {horizon})")
        self.value, self.target, self.horizon = float(init_beta), float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move beta toward keeping the observed KL near target; n_steps = samples (or steps) since last update."""
        if not math.isfinite(current_kl):
            return self.value
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value


class KLControl:
    """The KL penalty to the frozen reference: an estimator (registry `kl`) and its coefficient, fixed or
    adaptive toward a target; used in the loss (loss term `kl`) or folded into the rewards."""

    def __init__(self, coef: float, estimator: str = "k3", target: float | None = None, horizon: int = 10000,
                 where: str = "algo.kl_estimator"):
        self.estimate = KL_ESTIMATORS.bind(estimator, where=where)
        self.controller = AdaptiveKLController(coef, target, horizon) if target else FixedKLController(coef)

    @property
    def value(self) -> float:
        """The coefficient this step uses."""
        return self.controller.value

    def after_update(self, kl: float, samples: int) -> dict[str, float]:
        """The coefficient this step used (`kl_coef`); then an adaptive one moves toward its target."""
        out = {"kl_coef": self.controller.value}
        self.controller.update(kl, samples)
        return out

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.controller.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.controller.value = float(state["kl_coef"])
