"""Distillation losses: `fn(x: DistillInputs, *, options) -> (loss [N, L], metrics)`.

The student samples a completion; the teacher scores the same tokens. Each loss is per
token, to be *minimised*, exactly 0 where the mask is 0, and reduced to a scalar with
`upslope.algos.aggregate.aggregate` like the policy losses. Notation at one position t
(the prefix is the student's own sample): p_s the student's next-token distribution (at
the sampling temperature), p_t the teacher's (at its own temperature), x_t the sampled
token, S the teacher's k most likely tokens, and for a distribution p over the vocabulary
p|S(i) = p(i) / sum_{j in S} p(j) its renormalisation over S. With k = vocabulary size
every top-k quantity below is the exact full-vocabulary one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import Tensor

from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio, masked_mean
from upslope.bounds import NonNegative
from upslope.errors import ConfigError
from upslope.registry import DISTILL_LOSSES



@dataclass
class DistillInputs:
    """What a distillation loss sees, token-aligned like the Batch ([N, L] or [N, L, K])."""

    logprobs: Tensor  # log p_s(x_t), the student's log-prob of the sampled token (with gradient)
    teacher_logprobs: Tensor  # log p_t(x_t)
    mask: Tensor  # 1 on trained tokens
    student_topk: Tensor | None = None  # log p_s(i) at the teacher's top-k ids (with gradient, full-vocab normalised)
    teacher_topk: Tensor | None = None  # log p_t(i) at its top-k ids
    old_logprobs: Tensor | None = None  # log p_s(x_t) under the student that sampled (None: on-policy)

    def topk(self, loss: str) -> tuple[Tensor, Tensor]:
        if self.student_topk is None or self.teacher_topk is None:
            raise ConfigError(f"distillation loss '{loss}' needs the teacher's top-k log-probs (distill.top_k >= 1)")
        return self.student_topk, self.teacher_topk


def _zero_off(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _renormalised(topk_logprobs: Tensor) -> Tensor:
    """log p|S: log-probs renormalised over the k candidates (last dimension)."""
    return topk_logprobs - torch.logsumexp(topk_logprobs, dim=-1, keepdim=True)


def sampled_log_ratio(x: DistillInputs) -> Tensor:
    """k_t = log p_s(x_t) - log p_t(x_t), detached: with x_t ~ p_s, E[k_t] = KL(p_s || p_t) at t."""
    lr = (x.logprobs - x.teacher_logprobs).detach()
    return clamp_log_ratio(_zero_off(lr, x.mask), MAX_LOG_RATIO)


def topk_reverse_kl(student_topk: Tensor, teacher_topk: Tensor) -> Tensor:
    """sum_{i in S} p_s|S(i) (log p_s|S(i) - log p_t|S(i)) per position: [N, L]."""
    ls, lt = _renormalised(student_topk), _renormalised(teacher_topk)
    return (ls.exp() * (ls - lt)).sum(-1)


def topk_forward_ce(student_topk: Tensor, teacher_topk: Tensor) -> Tensor:
    """-sum_{i in S} p_t|S(i) log p_s(i) per position: [N, L] (student not renormalised)."""
    return -(_renormalised(teacher_topk).exp() * student_topk).sum(-1)


def topk_teacher_entropy(teacher_topk: Tensor) -> Tensor:
    """H(p_t|S) per position, so that forward_ce - H = KL(p_t|S || p_s) >= 0."""
    lt = _renormalised(teacher_topk)
    return -(lt.exp() * lt).sum(-1)


@DISTILL_LOSSES.register("sampled_rkl")
def sampled_rkl(x: DistillInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Reverse KL on the sampled tokens, trained as a policy gradient with per-token advantage -k_t.

    Estimator: k_t = log p_s(x_t) - log p_t(x_t), x_t ~ p_s, so E[k_t] = KL(p_s || p_t) at t.
    Loss: sg(k_t) * exp(log p_s(x_t) - sg(log p_old(x_t))): its value is k_t on-policy (the
    ratio is 1), its gradient sg(k_t) * ratio * grad log p_s(x_t). On-policy the expected
    gradient is E_{x~p_s}[(log p_s(x) - log p_t(x)) grad log p_s(x)] = grad KL(p_s || p_t)
    (the term E[grad log p_s] = 0 drops out), with the ratio it stays unbiased for samples of
    an older student. As in on-policy distillation (Agarwal et al., GKD; Thinking Machines)
    the advantage is per token with discount 0: each position is pulled toward the teacher's
    next-token distribution, not through its effect on later positions.
    """
    k = sampled_log_ratio(x)
    old = x.old_logprobs if x.old_logprobs is not None else x.logprobs
    log_ratio = clamp_log_ratio(_zero_off(x.logprobs - old.detach(), x.mask), MAX_LOG_RATIO)
    return _zero_off(k * torch.exp(log_ratio), x.mask), {}


@DISTILL_LOSSES.register("topk_rkl")
def topk_rkl(x: DistillInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Reverse KL over the teacher's top-k tokens, both distributions renormalised over them.

    loss_t = sum_{i in S} p_s|S(i) (log p_s|S(i) - log p_t|S(i)), differentiable through the
    student's log-probs (exact, no sampling); >= 0, 0 iff the two agree on S. Mass the
    student puts outside S is not penalised (k = vocabulary size: the exact KL(p_s || p_t)).
    """
    s, t = x.topk("topk_rkl")
    return _zero_off(topk_reverse_kl(s, t.detach()), x.mask), {}


@DISTILL_LOSSES.register("forward_ce")
def forward_ce(x: DistillInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy toward the teacher's top-k distribution (DistIL's forward KL up to the teacher entropy).

    loss_t = -sum_{i in S} p_t|S(i) log p_s(i), with the student's full-vocabulary log-probs,
    so mass outside S is penalised too. loss_t - H(p_t|S) = KL(p_t|S || p_s) >= 0 (the same
    gradient: the teacher entropy is a constant); k = vocabulary size: H(p_t) + KL(p_t || p_s).
    """
    s, t = x.topk("forward_ce")
    return _zero_off(topk_forward_ce(s, t.detach()), x.mask), {}


@DISTILL_LOSSES.register("mix")
def mix(x: DistillInputs, *, sampled_rkl: NonNegative = 0.0, topk_rkl: NonNegative = 0.5,
        forward_ce: NonNegative = 0.5) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted sum of the losses above, e.g. reverse and forward KL (weights are the options, >= 0).

    sampled_rkl: weight of the sampled reverse-KL loss (>= 0)
    topk_rkl: weight of the top-k reverse-KL loss (>= 0)
    forward_ce: weight of the top-k forward cross-entropy loss (>= 0; not all three 0)
    """
    weights = {"sampled_rkl": sampled_rkl, "topk_rkl": topk_rkl, "forward_ce": forward_ce}
    if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
        raise ConfigError(f"distill.loss.options: mix weights must be >= 0 and not all 0 (got {weights})")
    total = torch.zeros_like(x.logprobs)
    metrics: dict[str, Tensor] = {}
    for name, w in weights.items():
        if w > 0:
            part, _ = DISTILL_LOSSES.get(name).fn(x)
            total = total + w * part
            metrics[f"distill/{name}"] = masked_mean(part.detach(), x.mask)
    return total, metrics


def distill_metrics(x: DistillInputs) -> dict[str, Tensor]:
    """Per-token means whatever the loss: the sampled reverse-KL estimate `kl`, and over the
    teacher's top-k the reverse KL and the forward KL KL(p_t|S || p_s)."""
    out = {"kl": masked_mean(sampled_log_ratio(x), x.mask)}
    if x.student_topk is not None and x.teacher_topk is not None:
        s, t = x.student_topk.detach(), x.teacher_topk.detach()
        out["distill/rkl_topk"] = masked_mean(topk_reverse_kl(s, t), x.mask)
        out["distill/fkl_topk"] = masked_mean(topk_forward_ce(s, t) - topk_teacher_entropy(t), x.mask)
    return out


@DISTILL_LOSSES.register("arkd")
def arkd(x: DistillInputs, *, signal: Literal["teacher_entropy", "gap"] = "teacher_entropy",
         floor: Annotated[float, Field(ge=0, le=0.5)] = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """ARKD-style adaptive mix: w_t * KL(p_t|S || p_s) + (1 - w_t) * KL(p_s|S || p_t|S), with a per-token weight w_t.

    signal: what sets the forward-KL weight: "teacher_entropy" (H(p_t|S) / log k) or "gap" (FKL / (FKL + RKL))
    floor: the weight is kept in [floor, 1 - floor] so neither divergence is switched off (0..0.5)

    Forward KL covers the teacher's tail, reverse KL fits its main mode (Liu et al. 2026).
    ARKD learns the weights with an RL policy network rewarded per step; here a fixed rule
    stands in for it (our choice, no extra network): a flat teacher distribution (high
    normalised entropy) leans on forward KL, a peaked one on reverse KL; "gap" leans on the
    divergence that is larger now. The weight is detached; both terms are over the teacher's top-k.
    """
    if not 0 <= floor <= 0.5:
        raise ConfigError(f"distill.loss.options.floor must be in [0, 0.5] (got {floor})")
    s, t = x.topk("arkd")
    t = t.detach()
    fkl = topk_forward_ce(s, t) - topk_teacher_entropy(t)
    rkl = topk_reverse_kl(s, t)
    if signal == "teacher_entropy":
        k = t.shape[-1]
        w = topk_teacher_entropy(t) / torch.log(torch.tensor(float(max(k, 2))))
    elif signal == "gap":
        f, r = fkl.detach().clamp(min=0), rkl.detach().clamp(min=0)
        w = torch.where(f + r > 0, f / (f + r).clamp(min=1e-12), torch.full_like(f, 0.5))
    else:
        raise ConfigError(f"distill.loss.options.signal must be teacher_entropy or gap (got {signal!r})")
    w = w.detach().clamp(floor, 1 - floor)
    loss = _zero_off(w * fkl + (1 - w) * rkl, x.mask)
    return loss, {"distill/arkd_fkl_weight": masked_mean(w, x.mask)}
