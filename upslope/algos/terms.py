"""The RL loss as a sum of terms (registry `loss_term`, config `algo.terms`).

Each term reads the policy's outputs for a micro-batch and the batch's tensors (`LossInputs`) and
gives a per-token contribution (`TermOutput.add`) and metrics; a correction term may instead rescale
the terms before it (`TermOutput.scale`, e.g. truncated importance weights on the policy loss). The
RL objective sums the terms in order (the policy loss first), then aggregates the per-token loss
with algo.loss_agg: so a new method is a term, and neither the learner nor the objective changes.

A term is a small class: keyword-only `__init__` parameters are its options (checked like every
plugin's), class attributes are its traits, and optional hooks run around the update: `prepare`
(the whole batch, before it: e.g. reject tokens), `finish` (batch metrics, after it), `after_update`
(once per step: move a coefficient) and `state_dict` / `load_state_dict` (kept in checkpoints).

    @LOSS_TERMS.register("length_penalty")
    class LengthPenalty(LossTerm):
        '''Penalise every trained token a little.

        coef: the penalty per token
        '''
        def __init__(self, *, coef: float = 0.01):
            self.coef = coef

        def __call__(self, x: LossInputs) -> TermOutput:
            return TermOutput(add=self.coef * x.mask)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Callable, ClassVar, Literal, Sequence

from torch import Tensor

from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio
from upslope.algos.correction import importance_correction
from upslope.algos.kl import KLControl
from upslope.batch import Batch
from upslope.bounds import NonNegative, Positive, PositiveCount
from upslope.registry import LOSS_TERMS

Tokens = Annotated[Tensor, "[n, L]"]  # one value per token position of the micro-batch's rows
TopK = Annotated[Tensor, "[n, L, K]"]  # K values per token position
Metrics = dict[str, Any]  # name -> a float or a 0-d tensor (averaged over trained tokens by the learner)


@dataclass(frozen=True)
class LossInputs:
    """What a loss term reads for one micro-batch: the policy's outputs of this forward (with gradient)
    and the batch's tensors, all aligned to tokens and meaningful where `mask` > 0."""

    logprobs: Tokens  # log pi(token) under the policy being trained (with gradient)
    old_logprobs: Tokens  # the policy loss's ratio base (algo.old_policy), detached
    sampler_logprobs: Tokens  # what the rollout engine reported when it sampled
    advantages: Tokens
    mask: Tokens  # 1 on trained tokens
    entropy: Tokens | None = None  # the policy's entropy at each position (with gradient when a term asks)
    ref_logprobs: Tokens | None = None  # the frozen reference's (when a term needs the reference)
    topk_logprobs: TopK | None = None  # the policy's K most likely tokens' log-probs (when a term asks)

    @property
    def trained_tokens(self) -> float:
        """Tokens the micro-batch trains on (at least 1): a per-token metric's denominator."""
        return max(float(self.mask.sum()), 1.0)


@dataclass(frozen=True)
class TermOutput:
    """A term's part of the per-token loss: `add` is added to the terms before it (None: nothing),
    `scale` multiplies them first (None: nothing); `metrics` are micro-batch token means."""

    add: Tokens | None = None
    scale: Tokens | None = None
    metrics: Metrics = field(default_factory=dict)


class LossTerm:
    """One part of the RL loss (see the module's docstring). The traits below are read by the learner:
    a term that sets none of them contributes only through `__call__`."""

    zero_at_zero_advantage: ClassVar[bool] = False  # exactly 0 (and 0 gradient) on rows whose advantage is 0
    needs_reference: ClassVar[bool] = False  # reads ref_logprobs (the frozen reference is loaded)
    entropy_grad: ClassVar[bool] = False  # back-propagates through the entropy
    needs_old_logprobs: bool = False  # reads the batch's old log-probs in `prepare` (one no-grad forward)
    top_k: int = 0  # reads the policy's top-k log-probs from the same forward

    def __call__(self, x: LossInputs) -> TermOutput:
        raise NotImplementedError

    def prepare(self, batch: Batch) -> Batch:
        """The whole batch before the update (its old log-probs set when `needs_old_logprobs`)."""
        return batch

    def finish(self, batch: Batch) -> Metrics:
        """Metrics over the whole prepared batch, after the update."""
        return {}

    def after_update(self, metrics: Metrics, samples: int) -> Metrics:
        """Once per step, after the update, given the step's metrics and its number of samples."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What must survive a resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""


def sum_terms(terms: Sequence[LossTerm], x: LossInputs) -> tuple[Tokens, Metrics]:
    """The per-token loss of `terms` in order (each adds to, or rescales, the ones before it) and their metrics."""
    total: Tensor | None = None
    metrics: Metrics = {}
    for term in terms:
        out = term(x)
        if out.scale is not None:
            assert total is not None, f"{type(term).__name__} rescales the terms before it, and there are none"
            total = total * out.scale
        if out.add is not None:
            total = out.add if total is None else total + out.add
        metrics.update(out.metrics)
    assert total is not None, "a loss needs at least one term that adds"
    return total, metrics


class PolicyTerm(LossTerm):
    """The policy loss (algo.policy_loss) on the advantages: the first term of every RL loss."""

    def __init__(self, fn: Callable[..., tuple[Tensor, Metrics]], *, zero_at_zero_advantage: bool,
                 token_stats: bool = False, top_k: int = 0):
        self.fn, self.token_stats, self.top_k = fn, token_stats, top_k
        self.zero_at_zero_advantage = zero_at_zero_advantage  # type: ignore[misc]  (the policy loss's trait)
        self.entropy_grad = token_stats  # type: ignore[misc]  (a token_stats loss gets this forward's entropy)

    def __call__(self, x: LossInputs) -> TermOutput:
        stats = {"entropy": x.entropy, "topk_logprobs": x.topk_logprobs} if self.token_stats else {}
        per_token, metrics = self.fn(x.logprobs, x.old_logprobs, x.advantages, x.mask, **stats)
        return TermOutput(add=per_token, metrics=dict(metrics))


@LOSS_TERMS.register("tis")
class ImportanceCorrection(LossTerm):
    """Truncated importance sampling (TIS/MIS): the policy loss times min(rho, cap), rho = old / sampler.

    level: ratio per token, per sequence (product), or geometric mean
    cap: truncate importance weights above this
    mask_low: reject tokens/sequences whose ratio is below this before the update (null: none)
    mask_high: reject tokens/sequences whose ratio is above this before the update (null: none)

    Rejected units leave the loss mask in `prepare`, so they count in no normaliser (verl's rollout
    rejection); that needs the old policy's log-probs before the update. algo.correction sets it.
    """

    zero_at_zero_advantage = True  # a weight on the policy loss keeps its zeros

    def __init__(self, *, level: Literal["token", "sequence", "geometric"] = "token", cap: Positive = 2.0,
                 mask_low: Positive | None = None, mask_high: Positive | None = None):
        self.level, self.cap, self.mask_low, self.mask_high = level, cap, mask_low, mask_high
        self.needs_old_logprobs = mask_low is not None or mask_high is not None
        self.units = self.rejected = 0.0  # this update's correction units (tokens or rows), and those rejected

    def weights(self, old: Tensor, sampler: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Metrics]:
        return importance_correction(old, sampler, mask, level=self.level, cap=self.cap, mask_low=self.mask_low,
                                     mask_high=self.mask_high)

    def prepare(self, batch: Batch) -> Batch:
        """The batch without the rejected tokens (token level) or rows (sequence levels), counted."""
        if not self.needs_old_logprobs:
            return batch
        assert batch.old_logprobs is not None
        _, kept, _ = self.weights(batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask)
        before, after = batch.loss_mask > 0, kept > 0
        if self.level != "token":  # the sequence levels reject whole rows: count rows with a trained token
            before, after = before.any(dim=1), after.any(dim=1)
        self.units += float(before.sum())
        self.rejected += float((before & ~after).sum())
        return replace(batch, loss_mask=kept)

    def __call__(self, x: LossInputs) -> TermOutput:
        weights, _, m = self.weights(x.old_logprobs, x.sampler_logprobs, x.mask)
        return TermOutput(scale=weights, metrics={"tis/capped_frac": m["capped_frac"],
                                                  "tis/masked_frac": m["masked_frac"]})

    def finish(self, batch: Batch) -> Metrics:
        """What `prepare` rejected (the micro-batches saw only the kept tokens)."""
        if not self.needs_old_logprobs:
            return {}
        out = {"tis/masked_frac": self.rejected / max(self.units, 1.0)}
        self.units = self.rejected = 0.0
        return out


@LOSS_TERMS.register("kl")
class KLPenalty(LossTerm):
    """KL to the frozen reference in the loss: coef x a KL estimate per token (algo.kl_coef with kl_in=loss).

    coef: beta, the KL weight (with target: its start)
    estimator: the KL estimator (registry: kl)
    target: adaptive KL: the KL per token the coefficient is moved toward (null: fixed coef)
    horizon: adaptive KL: horizon in samples
    """

    needs_reference = True

    def __init__(self, *, coef: NonNegative = 0.0, estimator: str = "k3", target: Positive | None = None,
                 horizon: PositiveCount = 10000):
        self.control = KLControl(coef, estimator, target, horizon)

    def __call__(self, x: LossInputs) -> TermOutput:
        assert x.ref_logprobs is not None, "the KL term needs the reference's log-probs"
        kl = self.control.estimate(x.logprobs, x.ref_logprobs)
        return TermOutput(add=self.control.value * kl,
                          metrics={"kl": float((kl.detach() * x.mask).sum()) / x.trained_tokens})

    def after_update(self, metrics: Metrics, samples: int) -> Metrics:
        return self.control.after_update(float(metrics.get("kl", 0.0)), samples)

    def state_dict(self) -> dict[str, Any]:
        return self.control.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.control.load_state_dict(state)


@LOSS_TERMS.register("entropy")
class EntropyBonus(LossTerm):
    """An entropy bonus: minus coef x the policy's entropy at every token (algo.entropy_coef).

    coef: the bonus per nat of entropy
    """

    entropy_grad = True

    def __init__(self, *, coef: NonNegative = 0.0):
        self.coef = coef

    def __call__(self, x: LossInputs) -> TermOutput:
        assert x.entropy is not None
        return TermOutput(add=-self.coef * x.entropy)


def mismatch(logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> float:
    """Mean |log p_learner - log p_sampler| over the trained tokens; the gap is clamped as the
    losses clamp log-ratios (both -inf counts as 0), so the metric is never NaN."""
    gap = clamp_log_ratio(logprobs - sampler_logprobs, MAX_LOG_RATIO).abs()
    return float((gap * mask).sum()) / max(float(mask.sum()), 1.0)


@LOSS_TERMS.register("mismatch")
class Mismatch(LossTerm):
    """The train/inference mismatch metric (`mismatch`: mean |learner - sampler| log-prob), no loss.

    Measured on the batch's old log-probs when it has them (the learner's weights before the update),
    else on this forward's (the same weights: one update per batch). Every RL loss has it.
    """

    zero_at_zero_advantage = True

    def __call__(self, x: LossInputs) -> TermOutput:
        return TermOutput(metrics={"mismatch": mismatch(x.logprobs.detach(), x.sampler_logprobs, x.mask)})

    def finish(self, batch: Batch) -> Metrics:
        if batch.old_logprobs is None:
            return {}
        return {"mismatch": mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask)}
