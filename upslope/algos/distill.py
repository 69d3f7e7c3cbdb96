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
import math
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio, masked_mean
from upslope.bounds import Fraction, NonNegative, Positive
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


def arkd_signal(fkl: Tensor, rkl: Tensor, teacher_topk: Tensor, signal: str) -> Tensor:
    """ARKD's per-token signal in [0, 1], detached: the teacher's normalised entropy H(p_t|S) / log k
    ("teacher_entropy") or the forward KL's share FKL / (FKL + RKL) ("gap"; 1/2 where both are 0)."""
    if signal == "teacher_entropy":
        k = teacher_topk.shape[-1]
        return (topk_teacher_entropy(teacher_topk) / torch.log(torch.tensor(float(max(k, 2))))).detach()
    if signal == "gap":
        f, r = fkl.detach().clamp(min=0), rkl.detach().clamp(min=0)
        return torch.where(f + r > 0, f / (f + r).clamp(min=1e-12), torch.full_like(f, 0.5))
    raise ConfigError(f"distill.loss.options.signal must be teacher_entropy or gap (got {signal!r})")


@DISTILL_LOSSES.register("arkd")
class Arkd:
    """ARKD-style adaptive mix: w_t * KL(p_t|S || p_s) + (1 - w_t) * KL(p_s|S || p_t|S), with a per-token weight w_t.

    signal: what the weight reads: "teacher_entropy" (H(p_t|S) / log k) or "gap" (FKL / (FKL + RKL))
    floor: the weight is kept in [floor, 1 - floor] so neither divergence is switched off (0..0.5)
    weighting: rule (w = the signal) or learned (w = sigmoid(a + b x signal), (a, b) fit online by an RL signal)
    init_a: the learned weighting's starting a (with init_b: -2, 4 is close to the rule)
    init_b: the learned weighting's starting b
    lr: step size of the learned weighting's update (> 0)
    sigma: std of the exploration noise on (a, b) each step (> 0)
    baseline_decay: decay of the running mean reward the update subtracts (0..1)
    seed: seed of the exploration noise

    Forward KL covers the teacher's tail, reverse KL fits its main mode (Liu et al. 2026). ARKD sets the
    weights with a policy network rewarded per step. `learned` is a two-parameter logistic policy on the
    signal, fit by evolution-strategies REINFORCE (our choice of network and estimator): each step runs
    with (a, b) + eps, eps ~ N(0, sigma^2); its reward is the drop of the student's top-k FKL + RKL from
    that step to the next (both measured on the step's samples before its update); then
    (a, b) += lr x (reward - running mean reward) x eps / sigma^2. The weight is detached; both terms are
    over the teacher's top-k.
    """

    def __init__(self, *, signal: Literal["teacher_entropy", "gap"] = "teacher_entropy",
                 floor: Annotated[float, Field(ge=0, le=0.5)] = 0.1, weighting: Literal["rule", "learned"] = "rule",
                 init_a: float = -2.0, init_b: float = 4.0, lr: Positive = 1.0, sigma: Positive = 0.5,
                 baseline_decay: Fraction = 0.9, seed: int = 0):
        if not 0 <= floor <= 0.5:
            raise ConfigError(f"distill.loss.options.floor must be in [0, 0.5] (got {floor})")
        if lr <= 0 or sigma <= 0:
            raise ConfigError(f"distill.loss.options: lr and sigma must be > 0 (got {lr}, {sigma})")
        self.signal, self.floor, self.learned = signal, floor, weighting == "learned"
        self.lr, self.sigma, self.decay, self.seed = lr, sigma, baseline_decay, seed
        self.theta = torch.tensor([init_a, init_b], dtype=torch.float64)
        self.baseline, self.steps = 0.0, 0
        self.pending: Tensor | None = None  # the last step's noise, waiting for its reward
        self.last: float | None = None  # the divergence measured at the last step
        self.noise = self.draw()

    def draw(self) -> Tensor:
        """This step's exploration noise on (a, b), seeded by `seed` and the steps done (zero for `rule`)."""
        if not self.learned:
            return torch.zeros(2, dtype=torch.float64)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.steps)
        return torch.randn(2, generator=gen, dtype=torch.float64) * self.sigma

    def weight(self, u: Tensor) -> Tensor:
        """The forward-KL weight of signal values `u`, kept in [floor, 1 - floor]."""
        if self.learned:
            a, b = (self.theta + self.noise).tolist()
            u = torch.sigmoid(a + b * u)
        return u.detach().clamp(self.floor, 1 - self.floor)

    def __call__(self, x: DistillInputs) -> tuple[Tensor, dict[str, Tensor]]:
        s, t = x.topk("arkd")
        t = t.detach()
        fkl = topk_forward_ce(s, t) - topk_teacher_entropy(t)
        rkl = topk_reverse_kl(s, t)
        w = self.weight(arkd_signal(fkl, rkl, t, self.signal))
        loss = _zero_off(w * fkl + (1 - w) * rkl, x.mask)
        return loss, {"distill/arkd_fkl_weight": masked_mean(w, x.mask)}

    def after_update(self, metrics: dict[str, float]) -> dict[str, float]:
        """Once per step, given its metrics: the learned weighting's update from the last step's reward."""
        if not self.learned:
            return {}
        d = float(metrics.get("distill/fkl_topk", math.nan)) + float(metrics.get("distill/rkl_topk", math.nan))
        out: dict[str, float] = {}
        if self.pending is not None and self.last is not None and math.isfinite(d):
            reward = self.last - d
            self.theta = self.theta + self.lr * (reward - self.baseline) * self.pending / self.sigma ** 2
            self.baseline = self.decay * self.baseline + (1 - self.decay) * reward
            out["distill/arkd_reward"] = reward
        self.pending, self.last = self.noise, (d if math.isfinite(d) else None)
        self.steps += 1
        self.noise = self.draw()
        out["distill/arkd_a"], out["distill/arkd_b"] = self.theta.tolist()
        return out

    def state_dict(self) -> dict[str, Any]:
        """The learned weighting's state ({} for `rule`, which keeps none)."""
        if not self.learned:
            return {}
        return {"theta": self.theta.tolist(), "baseline": self.baseline, "steps": self.steps, "last": self.last,
                "pending": None if self.pending is None else self.pending.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.theta = torch.tensor(state["theta"], dtype=torch.float64)
        self.baseline, self.steps, self.last = float(state["baseline"]), int(state["steps"]), state["last"]
        self.pending = None if state["pending"] is None else torch.tensor(state["pending"], dtype=torch.float64)
        self.noise = self.draw()
