"""Advantages shaped by the policy's own confidence: ConSteer-RL, ISPO, CoDaPO.

Confidence comes from the sampler's log-probs of the sampled tokens (`batch.sampler_logprobs`), in
every batch at no cost: a rollout's confidence is its geometric-mean token probability
exp(mean log p) in (0, 1]. "Correct" is reward >= `threshold` (the verifier's 0/1 on our tasks).
"""
from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_moments, group_normalize, masked_mean
from upslope.algos.credit import grpo_per_sample
from upslope.batch import Batch
from upslope.bounds import NonNegative, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def sequence_confidence(batch: Batch) -> Tensor:
    """exp(mean log p of the trained tokens) per sample [N], float64 (1 for a row with none)."""
    return torch.exp(masked_mean(batch.sampler_logprobs.to(torch.float64), batch.loss_mask, dim=1))


def _correct(batch: Batch, threshold: float, who: str) -> Tensor:
    if batch.rewards is None:
        raise ConfigError(f"advantage '{who}' needs batch.rewards (score the batch first)")
    return (batch.rewards >= threshold).to(torch.float64)


@ADVANTAGES.register("consteer", grouped=True)
def consteer(batch: Batch, *, beta: NonNegative = 0.5, threshold: float = 0.5,
             normalize: Literal["shaped", "outcome"] = "shaped") -> Tensor:
    """ConSteer-RL (Miao et al. 2026): GRPO on r + beta x c for a correct rollout and r - beta x c for a wrong one.

    beta: weight of the confidence term (>= 0; 0 is GRPO)
    threshold: a reward >= this counts as correct
    normalize: `shaped` (the shaped reward is group-normalised as a whole) or `outcome` (GRPO's advantage of r plus
    beta x the group-centred signed confidence, not divided by a std)

    c is the rollout's geometric-mean token probability. The shaped reward pays confident right
    answers and penalises confident wrong ones most; its form (additive, signed by correctness) is
    our choice. It breaks ties: an all-correct group now prefers its more confident rollouts. With
    `shaped`, a group whose outcomes tie gets its confidence differences divided by their own small std:
    an all-wrong group pushes toward its least confident rollouts at full advantage scale, which on the
    headroom task (20% base accuracy, mostly all-wrong groups early) drove one seed of three from
    entropy 1.9 to 5.6 nats and 0.2% accuracy in 10 steps (docs/reproductions.md). `outcome` keeps the
    confidence term at beta x its spread, a tie-breaker next to the outcome's unit-scale advantage.
    """
    if beta < 0:
        raise ConfigError(f"consteer beta must be >= 0 (got {beta})")
    signed = (2 * _correct(batch, threshold, "consteer") - 1) * sequence_confidence(batch)
    assert batch.rewards is not None  # checked by _correct
    if normalize == "outcome":
        per_sample = grpo_per_sample(batch, "consteer").to(torch.float64) + beta * group_normalize(
            signed, batch.group_ids, scale_by_std=False).to(torch.float64)
    else:
        per_sample = group_normalize(batch.rewards.to(torch.float64) + beta * signed, batch.group_ids)
    return broadcast_to_tokens(per_sample.float(), batch.loss_mask)


@ADVANTAGES.register("ispo", grouped=True, features="answer_gain")
def ispo(batch: Batch, features: Tensor | None = None, *, beta: NonNegative = 0.5,
         tau: Annotated[float, Field(ge=0, lt=1)] = 0.9, threshold: float = 0.5, seq_coef: NonNegative = 0.5,
         answer_tokens: PositiveCount = 4) -> Tensor:
    """ISPO (Chen et al. 2026): GRPO plus seq_coef x the reasoning's informativeness (centred in its group), minus
    beta x max(0, p_t - tau) on the tokens of wrong rollouts.

    beta: weight of the hallucinated-certainty hinge (>= 0; 0: no hinge)
    tau: probability above which a token of a wrong rollout counts as confidently wrong (0..1)
    threshold: a reward >= this counts as correct
    seq_coef: weight of the sequence-level informativeness signal (>= 0; 0: the token part alone)
    answer_tokens: a rollout's answer is its last this many trained tokens; the tokens before it are its reasoning

    Informativeness (`features`, the RL trainer's `answer_gain` pass: two no-grad forwards of the policy) is
    the mean log-prob of the answer after the prompt and the reasoning minus after the prompt alone; a
    rollout with no reasoning has 0. It is added to the GRPO advantage centred in the group and not divided
    by a std (our choice: a group whose outcomes tie gets the signal at its own scale, not blown up), so a
    tied group still learns which reasoning supported its answer. The hinge is dense: a wrong rollout in an
    all-wrong group still gets a gradient away from its confident tokens; which tokens are "critical
    decisions" is open in the abstract, and we apply it to every token above tau. Without `features`
    (called outside the trainer) the sequence part is left out.
    """
    if beta < 0 or not 0 <= tau < 1 or seq_coef < 0:
        raise ConfigError(f"ispo needs beta >= 0, 0 <= tau < 1 and seq_coef >= 0 (got {beta}, {tau}, {seq_coef})")
    wrong = 1 - _correct(batch, threshold, "ispo")
    p = batch.sampler_logprobs.to(torch.float64).exp()
    hinge = (p - tau).clamp(min=0) * wrong[:, None] * (batch.loss_mask > 0)
    per_sample = grpo_per_sample(batch, "ispo").to(torch.float64)
    if features is not None and seq_coef:
        if features.shape[0] != batch.size:
            raise ConfigError(f"advantage 'ispo': {features.shape[0]} informativeness values for {batch.size} rollouts")
        gain = features[:, 0].to(torch.float64)
        per_sample = per_sample + seq_coef * group_normalize(gain, batch.group_ids, scale_by_std=False).to(torch.float64)
    adv = broadcast_to_tokens(per_sample, batch.loss_mask).to(torch.float64)
    return (adv - beta * hinge).float()


def learnable_value(p: Tensor, c: Tensor) -> Tensor:
    """CoDaPO's question value in [0, 1]: 4p(1 - p)(1 - c), p a pass rate and c a mean rollout confidence."""
    return 4 * p * (1 - p) * (1 - c)


def codapo_weights(batch: Batch, *, w_min: float, w_max: float, threshold: float) -> Tensor:
    """Per-sample question weight [N]: w_min + (w_max - w_min) x 4p(1 - p) x (1 - c), p the group's pass
    rate and c its mean rollout confidence."""
    p = group_moments(_correct(batch, threshold, "codapo"), batch.group_ids)[0]
    c = group_moments(sequence_confidence(batch), batch.group_ids)[0]
    return w_min + (w_max - w_min) * learnable_value(p, c)


@ADVANTAGES.register("codapo", grouped=True)
def codapo(batch: Batch, *, w_min: NonNegative = 0.5, w_max: NonNegative = 2.0, threshold: float = 0.5) -> Tensor:
    """CoDaPO (Zhou et al. 2026): each question's GRPO advantage x a bounded weight from pass rate and confidence.

    w_min: weight of a question with nothing to learn (solved or unsolved by all, or fully confident)
    w_max: weight of the most learnable question (pass rate 1/2, confidence 0); w_min <= w_max
    threshold: a reward >= this counts as correct

    The value 4p(1 - p)(1 - c) (learnable band x room left by confidence inflation) is our choice;
    the abstract gives only its inputs and that it is bounded. CoDaPO's resampling of high-value
    questions is the sampler `codapo` (upslope.data.samplers), by the same value.
    """
    if not 0 <= w_min <= w_max:
        raise ConfigError(f"codapo needs 0 <= w_min <= w_max (got {w_min}, {w_max})")
    w = codapo_weights(batch, w_min=w_min, w_max=w_max, threshold=threshold)
    return broadcast_to_tokens((grpo_per_sample(batch, "codapo") * w).float(), batch.loss_mask)
