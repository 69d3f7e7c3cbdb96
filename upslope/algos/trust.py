"""Train/inference discrepancy as a constraint (DCMDP, loss term `dcmdp`) and the sampler-side acceptance
test of an update (MIPU, update check `mipu`).

DCMDP (Liu et al. 2026): maximise reward subject to D(train || sampler) <= tolerance, relaxed
with a Lagrange multiplier lambda >= 0 that dual ascent moves every step:
lambda <- max(0, lambda + lr * (D - tolerance)). Inside the tolerance region lambda decays
to 0 and the policy explores freely; outside it the penalty lambda * D pulls the training
policy back toward what the sampler computes. The discrepancy is k3 of the training
log-probs against the sampler's on the sampled tokens (>= 0; our choice of estimator).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio
from upslope.algos.kl import k3
from upslope.algos.terms import LossInputs, LossTerm, Metrics, TermOutput
from upslope.batch import Batch
from upslope.bounds import NonNegative, Positive
from upslope.errors import ConfigError
from upslope.registry import ACCEPTS, LOSS_TERMS


def discrepancy(logprobs: Tensor, sampler_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(train || sampler) on the sampled tokens [N, L] (mask it before use)."""
    return k3(logprobs, sampler_logprobs)


class DualController:
    """A Lagrange multiplier kept >= 0 and moved by dual ascent; its state is checkpointed (`state_dict`)."""

    def __init__(self, init: float, lr: float, tolerance: float):
        if init < 0 or lr <= 0 or tolerance < 0:
            raise ConfigError(f"loss term dcmdp needs init >= 0, lr > 0, tolerance >= 0 "
                              f"(got {init}, {lr}, {tolerance})")
        self.value, self.lr, self.tolerance = float(init), float(lr), float(tolerance)

    def update(self, observed: float) -> float:
        """lambda <- max(0, lambda + lr * (observed - tolerance)); a non-finite observation changes nothing."""
        if math.isfinite(observed):
            self.value = max(0.0, self.value + self.lr * (observed - self.tolerance))
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


def proxy_parts(logprobs: Tensor, sampler_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> tuple[float, float]:
    """(gain, gap): token means of (pi_new / pi_sampler - 1) * A and of D = k3(pi_new, pi_sampler) over mask > 0."""
    m = mask > 0
    n = m.sum().clamp(min=1)
    # clamped to +-20 with inf - inf as 0, as the policy losses and k3 do (a NaN gain would veto every update)
    lr = clamp_log_ratio(torch.where(m, logprobs - sampler_logprobs, torch.zeros_like(logprobs)), MAX_LOG_RATIO)
    gain = torch.where(m, torch.expm1(lr) * advantages, torch.zeros_like(lr)).sum() / n
    gap = torch.where(m, discrepancy(logprobs, sampler_logprobs), torch.zeros_like(lr)).sum() / n
    return float(gain), float(gap)


def improvement_proxy(logprobs: Tensor, sampler_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                      gap_coef: float) -> float:
    """MIPU's inference-side proxy of a candidate: gain - gap_coef * gap (`proxy_parts`).

    The gain is the surrogate improvement of the candidate measured against the policy that
    sampled (the deployed one), the gap its train/inference discrepancy (k3, as DCMDP). A
    candidate whose proxy is not above 0 is not expected to improve the deployed policy.
    """
    gain, gap = proxy_parts(logprobs, sampler_logprobs, advantages, mask)
    return gain - gap_coef * gap


@LOSS_TERMS.register("dcmdp")
class DiscrepancyConstraint(LossTerm):
    """DCMDP: lambda x the train/inference discrepancy (k3 vs the sampler) per token, lambda moved by dual ascent.

    init: the multiplier lambda at step 0
    lr: dual ascent step: lambda += lr * (discrepancy - tolerance) after each step
    tolerance: discrepancy (k3 per token) the policy may keep for free: the tolerance region
    """

    def __init__(self, *, init: NonNegative = 0.0, lr: Positive = 1.0, tolerance: NonNegative = 1e-3):
        self.dual = DualController(init, lr, tolerance)

    def __call__(self, x: LossInputs) -> TermOutput:
        disc = discrepancy(x.logprobs, x.sampler_logprobs)
        return TermOutput(add=self.dual.value * disc,
                          metrics={"dcmdp/discrepancy": float((disc.detach() * x.mask).sum()) / x.trained_tokens})

    def after_update(self, metrics: Metrics, samples: int) -> Metrics:
        """The multiplier this step used; then dual ascent moves it by the step's discrepancy."""
        out = {"dcmdp/lambda": self.dual.value}
        if (observed := metrics.get("dcmdp/discrepancy")) is not None:
            self.dual.update(float(observed))
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.dual.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dual.load_state_dict(state)


@ACCEPTS.register("mipu")
class ImprovementCheck:
    """MIPU: keep an update only if the sampler-side proxy (gain - gap_coef x gap) says the deployed policy improves.

    gap_coef: weight of the train/inference gap (k3 per token) subtracted in the proxy
    min_gain: accept a candidate when its proxy exceeds this

    An update check is called after the update with the batch and the updated policy's log-probs on
    it (one extra forward); a vetoed update is undone (weights and optimiser state restored).
    """

    def __init__(self, *, gap_coef: NonNegative = 1.0, min_gain: float = 0.0):
        self.gap_coef, self.min_gain = gap_coef, min_gain

    def __call__(self, batch: Batch, logprobs: Tensor) -> tuple[bool, Metrics]:
        assert batch.advantages is not None
        gain, gap = proxy_parts(logprobs, batch.sampler_logprobs, batch.advantages, batch.loss_mask)
        proxy = gain - self.gap_coef * gap
        accepted = proxy > self.min_gain
        return accepted, {"mipu/proxy": proxy, "mipu/gain": gain, "mipu/gap": gap, "mipu/accepted": float(accepted)}
