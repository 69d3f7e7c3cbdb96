"""Policy losses: `fn(logprobs, old_logprobs, advantages, mask, *, options) -> (loss [N, L], metrics)`.

The per-token loss is to be *minimised*, is exactly 0 where mask is 0 (padding can hold
any finite or infinite log-prob without leaking into value or gradient), and is reduced
to a scalar by `upslope.algos.aggregate.aggregate`. Metrics are detached scalar tensors.
Log-ratios are clamped to +-20 before exp so a stray token cannot overflow to inf (and a
log-ratio of inf - inf counts as 0), so no non-finite value leaves a loss; GSPO's option
`clamp` chooses where its clamp applies.
A loss registered with `zero_at_zero_advantage=True` is exactly 0, with 0 gradient, on a
row whose advantage is 0 everywhere: the learner then skips such rows (train.skip_zero_advantage).
"""
from typing import Literal

import torch
from torch import Tensor

from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio, masked_mean
from upslope.bounds import ClipLow, NonNegative, PositiveFraction
from upslope.errors import ConfigError
from upslope.registry import POLICY_LOSSES



def _log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, bound: float | None = MAX_LOG_RATIO) -> Tensor:
    """logprobs - old_logprobs (old detached) on mask > 0, 0 elsewhere and for NaN (inf - inf), clamped to +-bound."""
    return clamp_log_ratio(torch.where(mask > 0, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs)), bound)


def _zero_off(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _metric(x: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(x.detach().to(torch.float32), mask)


def _check_eps(eps_low: float, eps_high: float) -> None:
    if not 0 <= eps_low < 1 or eps_high < 0:
        raise ConfigError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0 (got {eps_low}, {eps_high})")


def _clipped(ratio: Tensor, adv: Tensor, mask: Tensor, eps_low: float, eps_high: float,
             dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO surrogate max(-r A, -clip(r) A) (+ dual clip) and the fractions of tokens whose clip is active."""
    surrogate = torch.maximum(-ratio * adv, -ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    r = ratio.detach()
    metrics = {
        "clip_frac_low": _metric((r < 1 - eps_low) & (adv < 0), mask),
        "clip_frac_high": _metric((r > 1 + eps_high) & (adv > 0), mask),
        "ratio_mean": _metric(r, mask),
    }
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ConfigError(f"dual_clip must be > 1 (got {dual_clip})")
        bound = -dual_clip * adv
        metrics["clip_frac_dual"] = _metric((adv < 0) & (surrogate.detach() > bound), mask)
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, bound), surrogate)
    return _zero_off(surrogate, mask), metrics


@POLICY_LOSSES.register("ppo_clip", zero_at_zero_advantage=True)
def ppo_clip(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: ClipLow = 0.2,
             eps_high: NonNegative = 0.2, dual_clip: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO/GRPO/DAPO clipped surrogate with asymmetric clip (DAPO: eps_high 0.28) and optional dual clip c > 1.

    eps_low: the ratio is clipped below at 1 - eps_low (0 <= eps_low < 1)
    eps_high: the ratio is clipped above at 1 + eps_high (>= 0; DAPO: 0.28)
    dual_clip: c > 1: for A < 0 each token's loss is capped at -c * A (null: off)
    """
    _check_eps(eps_low, eps_high)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask))
    return _clipped(ratio, _zero_off(advantages.detach(), mask), mask, eps_low, eps_high, dual_clip)


@POLICY_LOSSES.register("gspo", zero_at_zero_advantage=True)
def gspo(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: ClipLow = 3e-4,
         eps_high: NonNegative = 4e-4,
         clamp: Literal["sequence", "token", "none"] = "sequence") -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: sequence ratio exp(mean token log-ratio), clipped per sequence, token-level sg form (GSPO-token).

    eps_low: the sequence ratio is clipped below at 1 - eps_low (0 <= eps_low < 1; paper: 3e-4)
    eps_high: the sequence ratio is clipped above at 1 + eps_high (>= 0; paper: 4e-4)
    clamp: log-ratio clamp at +-20: the sequence mean ("sequence"), each token ("token") or none ("none")

    s_{i,t} = sg[s_i] * exp(lp_t - sg[lp_t]): its value is s_i on every token, its gradient
    wrt lp_t is s_i. Aggregated with `seq_mean_token_mean` this is exactly GSPO's gradient.
    `clamp`: "sequence" (default, as verl) clamps only the sequence log-ratio at +-20, so the
    ratio is the paper's whenever it is representable and still cannot overflow; "token"
    clamps each token's log-ratio first (changes s_i whenever one token is beyond 20);
    "none" is the paper's formula unguarded (inf once the mean log-ratio passes ~88).
    """
    _check_eps(eps_low, eps_high)
    if clamp not in ("sequence", "token", "none"):
        raise ConfigError(f"gspo clamp must be sequence, token or none (got {clamp!r})")
    lr = _log_ratio(logprobs, old_logprobs, mask, MAX_LOG_RATIO if clamp == "token" else None)
    n = (mask > 0).sum(dim=1, keepdim=True).clamp(min=1)
    seq_lr = lr.detach().sum(dim=1, keepdim=True) / n
    if clamp == "sequence":
        seq_lr = seq_lr.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    lp = _zero_off(logprobs, mask)
    ratio = torch.exp(seq_lr + lp - lp.detach())
    return _clipped(ratio, _zero_off(advantages.detach(), mask), mask, eps_low, eps_high, None)


@POLICY_LOSSES.register("cispo", zero_at_zero_advantage=True)
def cispo(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_high: NonNegative = 0.28,
          eps_low: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: -sg(clip(ratio, max=1+eps_high[, min=1-eps_low])) * A * logprob; every token keeps its gradient.

    eps_high: the detached IS weight is capped at 1 + eps_high (>= 0)
    eps_low: the IS weight is floored at 1 - eps_low (0 <= eps_low < 1; null: no floor)
    """
    _check_eps(eps_low or 0.0, eps_high)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask)).detach()
    weight = ratio.clamp(min=None if eps_low is None else 1 - eps_low, max=1 + eps_high)
    loss = -weight * _zero_off(advantages.detach(), mask) * _zero_off(logprobs, mask)
    low = ratio < 1 - eps_low if eps_low is not None else torch.zeros_like(ratio, dtype=torch.bool)
    metrics = {
        "clip_frac_low": _metric(low, mask),
        "clip_frac_high": _metric(ratio > 1 + eps_high, mask),
        "ratio_mean": _metric(ratio, mask),
    }
    return _zero_off(loss, mask), metrics


@POLICY_LOSSES.register("reinforce", zero_at_zero_advantage=True)
def reinforce(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
              mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain policy gradient -A * logprob (no ratio, no clip): on-policy only."""
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask)).detach()
    loss = -_zero_off(advantages.detach(), mask) * _zero_off(logprobs, mask)
    return _zero_off(loss, mask), {"ratio_mean": _metric(ratio, mask)}


def _shift(old_logprobs: Tensor, ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(p_old, p_new - p_old) of the sampled token from the old log-prob and the (clamped) ratio; 0 off mask.

    p_old = exp(min(old, 0)) is a probability (a log-prob above 0 counts as 0), and the shift is
    p_old * (ratio - 1), so it stays finite wherever the ratio does.
    """
    p_old = torch.exp(_zero_off(old_logprobs.detach(), mask).clamp(max=0.0))
    return p_old, _zero_off(p_old * (ratio - 1), mask)


def _check_delta(delta: float) -> None:
    if not 0 < delta <= 1:
        raise ConfigError(f"trust-region delta must be in (0, 1] (a probability shift; got {delta})")


@POLICY_LOSSES.register("dppo", zero_at_zero_advantage=True)
def dppo(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, delta: PositiveFraction = 0.2,
         direction: Literal["harmful", "both"] = "harmful") -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO: -ratio * A, with a token's gradient masked once its probability moved |p_new - p_old| > delta.

    delta: the trust region, an absolute shift of the sampled token's probability (0 < delta <= 1)
    direction: mask only shifts past delta in the advantage's direction ("harmful", as PPO's clip) or both ways

    The ratio clip of PPO is replaced by a mask on the absolute probability shift of the
    sampled token, so a rare token (small p_old) may move by a large ratio and a common one
    cannot move far. Choices the abstract leaves open: delta's default (0.2), and that, as
    in PPO, only a shift in the direction the advantage pushes (A > 0 up, A < 0 down) is
    masked by default. A masked token keeps its loss value, -sg(ratio) * A, with 0 gradient.
    """
    _check_delta(delta)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask))
    adv = _zero_off(advantages.detach(), mask)
    _, shift = _shift(old_logprobs, ratio, mask)
    signed = shift.detach() * torch.sign(adv) if direction == "harmful" else shift.detach().abs()
    out = (signed > delta) & (mask > 0)
    loss = -torch.where(out, ratio.detach(), ratio) * adv
    metrics = {"trust/masked_frac": _metric(out, mask), "trust/shift_abs": _metric(shift.abs(), mask),
               "ratio_mean": _metric(ratio, mask)}
    return _zero_off(loss, mask), metrics


@POLICY_LOSSES.register("drpo", zero_at_zero_advantage=True)
def drpo(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, delta: PositiveFraction = 0.2,
         coef: NonNegative = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """DRPO: -ratio * A + coef * |A| * (p_new - p_old)^2 / (2 * delta * p_old), a smooth penalty instead of DPPO's mask.

    delta: where the penalty's pull cancels the policy gradient: a probability shift (0 < delta <= 1)
    coef: penalty weight (>= 0; 0: the unclipped policy gradient -ratio * A)

    With d = p_new - p_old = p_old (ratio - 1) the penalty is coef |A| p_old (ratio - 1)^2 / (2 delta),
    so the gradient wrt the log-prob is -A * ratio * (1 - coef * sign(A) * d / delta): weight 1 at
    d = 0, 0 on the trust-region boundary d = sign(A) * delta (DPPO's geometry with coef 1),
    corrective (pulling back) beyond it, and bounded since |d| <= 1. The exact regulariser of
    the paper is not in its abstract: this quadratic form, its normalisation by p_old (which
    keeps every gradient finite) and the defaults are our choice.
    """
    _check_delta(delta)
    if coef < 0:
        raise ConfigError(f"drpo coef must be >= 0 (got {coef})")
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask))
    adv = _zero_off(advantages.detach(), mask)
    p_old, shift = _shift(old_logprobs, ratio, mask)
    penalty = coef * adv.abs() * p_old * (ratio - 1) ** 2 / (2 * delta)
    metrics = {"trust/beyond_frac": _metric(shift.detach() * torch.sign(adv) > delta, mask),
               "trust/shift_abs": _metric(shift.abs(), mask), "trust/penalty": _metric(penalty, mask),
               "ratio_mean": _metric(ratio, mask)}
    return _zero_off(-ratio * adv + penalty, mask), metrics
