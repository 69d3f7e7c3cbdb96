"""Preference losses: `fn(policy, reference, *, options) -> PreferenceOut`, over per-sequence log-probs.

`policy` and `reference` are `PairLogps`: for P pairs, the summed log-probs of each pair's
chosen and rejected completion (sum of token log-probs x loss mask) and their token counts.
`reference` is None for reference-free losses (registered with `reference=False`). A loss registered
with `rewards=True` also gets the pairs' scalar rewards (`PairRewards`) as a third argument.
Each loss returns the per-pair loss [P] (to be minimised; the trainer averages it over
pairs) and the implicit rewards of the chosen and rejected completions [P] (detached);
their difference is the reward margin, and the fraction of pairs with margin > 0 is the
preference accuracy.

Options are checked when the loss is bound from the config (`dpo.loss.options`).
"""
from __future__ import annotations

from typing import Annotated, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from upslope.errors import ConfigError
from upslope.registry import PREFERENCE_LOSSES

Beta = Annotated[float, Field(gt=0)]
Temperature = Annotated[float, Field(gt=0)]
Smoothing = Annotated[float, Field(ge=0, lt=0.5)]


class PairLogps(NamedTuple):
    """Summed completion log-probs of P preference pairs and the completions' token counts."""

    chosen: Tensor  # [P]
    rejected: Tensor  # [P]
    chosen_tokens: Tensor  # [P], tokens trained on (loss mask) in the chosen completion
    rejected_tokens: Tensor  # [P]

    def mean(self) -> "PairLogps":
        """Length-averaged log-probs (sum / token count; an empty completion counts as one token)."""
        return self._replace(chosen=self.chosen / self.chosen_tokens.clamp(min=1),
                             rejected=self.rejected / self.rejected_tokens.clamp(min=1))


class PairRewards(NamedTuple):
    """The scalar rewards of P pairs' chosen and rejected completions (file pairs: 1 and 0; on-policy pairs:
    the combined rewards the samples earned)."""

    chosen: Tensor  # [P]
    rejected: Tensor  # [P]


class PreferenceOut(NamedTuple):
    loss: Tensor  # [P] per-pair loss
    chosen_reward: Tensor  # [P] implicit reward of the chosen completion (detached)
    rejected_reward: Tensor  # [P] implicit reward of the rejected completion (detached)


def bradley_terry_loss(h: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """-(1 - e) log sigmoid(h) - e log sigmoid(-h): the negative log-likelihood that the chosen
    completion wins under a Bradley-Terry model with score difference h, when a label is
    flipped with probability e (conservative DPO, Mitchell 2023)."""
    loss = -F.logsigmoid(h)
    return loss if not label_smoothing else (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-h)


def score_calibration_loss(scores: Tensor, labels: Tensor) -> Tensor:
    """Per row: the binary cross-entropy of sigmoid(score) against the row's label in [0, 1], so a reward
    model's sigmoid(score) reads as the probability that the reply is acceptable (CSRM's calibration term
    beside the Bradley-Terry ranking loss)."""
    return F.binary_cross_entropy_with_logits(scores.float(), labels.float().clamp(0.0, 1.0), reduction="none")


def _need(reference: PairLogps | None, name: str) -> PairLogps:
    if reference is None:
        raise ConfigError(f"preference loss '{name}' needs reference log-probs")
    return reference


@PREFERENCE_LOSSES.register("sigmoid", reference=True)
def sigmoid(policy: PairLogps, reference: PairLogps | None, *, beta: Beta = 0.1,
            label_smoothing: Smoothing = 0.0) -> PreferenceOut:
    """DPO (Rafailov et al., 2023): -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))) on summed log-probs.

    beta: scale of the implicit reward beta * (log pi - log ref) (> 0)
    label_smoothing: probability that a preference label is flipped (0 <= e < 0.5; conservative DPO)
    """
    ref = _need(reference, "sigmoid")
    chosen = beta * (policy.chosen - ref.chosen)
    rejected = beta * (policy.rejected - ref.rejected)
    return PreferenceOut(bradley_terry_loss(chosen - rejected, label_smoothing), chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("ipo", reference=True)
def ipo(policy: PairLogps, reference: PairLogps | None, *, beta: Beta = 0.1) -> PreferenceOut:
    """IPO (Azar et al., 2023): (h - 1/(2 beta))^2, h the log-ratio difference of length-averaged log-probs.

    beta: regularisation strength: the target margin is 1 / (2 beta) (> 0)
    """
    pol, ref = policy.mean(), _need(reference, "ipo").mean()
    chosen, rejected = pol.chosen - ref.chosen, pol.rejected - ref.rejected
    loss = (chosen - rejected - 1 / (2 * beta)) ** 2
    return PreferenceOut(loss, (beta * chosen).detach(), (beta * rejected).detach())


@PREFERENCE_LOSSES.register("simpo", reference=False)
def simpo(policy: PairLogps, reference: PairLogps | None = None, *, beta: Beta = 2.0, gamma: float = 1.0,
          label_smoothing: Smoothing = 0.0) -> PreferenceOut:
    """SimPO (Meng et al., 2024), reference-free: -log sigmoid(beta (avg_lp_c - avg_lp_r) - gamma).

    beta: scale of the length-averaged log-prob reward (> 0)
    gamma: target reward margin subtracted from the chosen - rejected difference
    label_smoothing: probability that a preference label is flipped (0 <= e < 0.5)
    """
    pol = policy.mean()
    chosen, rejected = beta * pol.chosen, beta * pol.rejected
    loss = bradley_terry_loss(chosen - rejected - gamma, label_smoothing)
    return PreferenceOut(loss, chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("sro", reference=True, rewards=True)
def sro(policy: PairLogps, reference: PairLogps | None, rewards: PairRewards, *, beta: Beta = 0.1,
        temperature: Temperature = 0.25) -> PreferenceOut:
    """SRO (soft reward optimisation): the cross-entropy of sigmoid(h) against the soft label
    sigmoid((r_c - r_r) / temperature), h = beta ((pi_c - ref_c) - (pi_r - ref_r)).

    Minimised at h = (r_c - r_r) / temperature: the policy's log-ratio differences match the reward differences
    of the KL-regularised optimum pi_ref exp(r / kappa) with kappa = beta x temperature. Equal rewards ask
    for no margin; DPO is the limit of temperature -> 0.

    beta: scale of the implicit reward beta * (log pi - log ref) (> 0)
    temperature: reward scale of the soft label (> 0): smaller is closer to DPO's hard label
    """
    ref = _need(reference, "sro")
    chosen, rejected = beta * (policy.chosen - ref.chosen), beta * (policy.rejected - ref.rejected)
    h = chosen - rejected
    target = torch.sigmoid((rewards.chosen - rewards.rejected).to(h.dtype) / temperature)
    loss = -(target * F.logsigmoid(h) + (1 - target) * F.logsigmoid(-h))
    return PreferenceOut(loss, chosen.detach(), rejected.detach())


@PREFERENCE_LOSSES.register("bro", reference=True, rewards=True)
def bro(policy: PairLogps, reference: PairLogps | None, rewards: PairRewards, *, beta: Beta = 0.1,
        threshold: float = 0.5, shift: float = 0.0) -> PreferenceOut:
    """BRO (binarised reward optimisation): each completion's reward is binarised (above `threshold`:
    desirable) and its own implicit reward z = beta (pi - ref) - shift is classified by it, -log sigmoid(z)
    for a desirable completion and -log sigmoid(-z) otherwise; a pair's loss is the mean of its two.

    Unpaired: a pair whose replies are both desirable raises both, unlike DPO's margin.

    beta: scale of the implicit reward beta * (log pi - log ref) (> 0)
    threshold: a reward above it is desirable
    shift: subtracted from the implicit reward before the logistic loss (the decision boundary)
    """
    ref = _need(reference, "bro")
    chosen, rejected = beta * (policy.chosen - ref.chosen), beta * (policy.rejected - ref.rejected)

    def term(z: Tensor, r: Tensor) -> Tensor:
        good = (r > threshold).to(z.dtype)
        return -(good * F.logsigmoid(z - shift) + (1 - good) * F.logsigmoid(shift - z))

    loss = (term(chosen, rewards.chosen) + term(rejected, rewards.rejected)) / 2
    return PreferenceOut(loss, chosen.detach(), rejected.detach())


def preference_metrics(outs: list[PreferenceOut], policy: list[PairLogps]) -> dict[str, float]:
    """Means over every pair seen: loss, implicit rewards, margin, accuracy (margin > 0), log-probs."""
    if not outs:
        return {}
    cat = lambda xs: torch.cat([x.detach().float().cpu() for x in xs])  # noqa: E731
    chosen, rejected = cat([o.chosen_reward for o in outs]), cat([o.rejected_reward for o in outs])
    margin = chosen - rejected
    return {
        "pref/loss": float(cat([o.loss for o in outs]).mean()),
        "pref/chosen_reward": float(chosen.mean()),
        "pref/rejected_reward": float(rejected.mean()),
        "pref/margin": float(margin.mean()),
        "pref/accuracy": float((margin > 0).float().mean()),
        "pref/logp_chosen": float(cat([p.chosen for p in policy]).mean()),
        "pref/logp_rejected": float(cat([p.rejected for p in policy]).mean()),
    }
