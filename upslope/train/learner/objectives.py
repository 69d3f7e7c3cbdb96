"""What an update optimises: one objective per method, passed by its trainer to
`Updater.update`. An objective declares what it needs from the model's forward (`Forward`:
temperature, entropy gradient, top-k, gathered ids, or a scalar head) and is then a pure function
of the forward's outputs and the micro-batch (`loss`); it may prepare the batch first (a pure
function of it; the updater computes the old log-probs it asks for), skip rows whose loss is
exactly zero, and add metrics over the whole batch (`finish`). It never calls the updater.

The RL objective knows no method: its loss is the sum of its terms (`upslope.algos.terms`), the
policy loss first, then the configured ones (importance correction, registered `algo.terms` such
as DCMDP, KL to the reference, the entropy bonus, the mismatch metric)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import torch

from upslope.algos.aggregate import aggregate, normalizer
from upslope.algos.preference import bradley_terry_loss
from upslope.algos.terms import LossInputs, LossTerm, PolicyTerm, sum_terms
from upslope.batch import Batch
from upslope.config import AlgoConfig, Config, TrainConfig
from upslope.registry import LOSS_TERMS, POLICY_LOSSES
from upslope.train.learner.logprobs import HeadOutput, Truncation

Metrics = dict[str, float]
ModelOutputs = HeadOutput | torch.Tensor  # the LM head's outputs, or a scalar head's values or scores


@dataclass(frozen=True)
class Forward:
    """What the update computes for an objective in each micro-batch's forward."""

    head: Literal["lm", "token_values", "sequence_scores"] = "lm"  # the LM head, or a scalar head's outputs
    temperature: float = 1.0  # log-probs of the distribution at this temperature
    entropy_grad: bool = False  # does the loss back-propagate through the entropy?
    top_k: int = 0  # also the model's K most likely tokens' log-probs
    gather: str | None = None  # a Batch field of token ids [n, L, K] whose log-probs the loss also needs
    truncation: Truncation = Truncation()  # the sampler's top-p / top-k: log-probs of what it drew from


@dataclass
class LossOutputs:
    """A micro-batch's share of the mini-batch loss (normalised by the mini-batch's counts) and its
    per-token-mean metrics."""

    loss: torch.Tensor
    metrics: Metrics


def zero_advantage_rows(batch: Batch) -> torch.Tensor:
    """bool [N]: rows whose advantage is 0 at every trained token (e.g. a GRPO group whose
    samples all got the same reward)."""
    assert batch.advantages is not None
    return ((batch.advantages != 0) & (batch.loss_mask > 0)).sum(dim=1) == 0


class Objective:
    """The default hooks: log-probs at temperature 1 (the model's own distribution), no
    preparation, no skipped rows, micro-batches free to split groups."""

    forward: Forward = Forward()
    whole_groups: bool = False  # must every micro-batch hold whole groups (pairs)?
    skips_rows: bool = False  # may rows with exactly zero loss be left out of the forward?
    needs_old_logprobs: bool = False  # does the batch need the policy's log-probs before the update?

    @property
    def temperature(self) -> float:
        """The temperature its log-probs are taken at."""
        return self.forward.temperature

    def prepare(self, batch: Batch) -> Batch:
        """The batch the update runs on (its old log-probs set when `needs_old_logprobs`)."""
        return batch

    def skip_rows(self, mini: Batch) -> torch.Tensor:
        """bool [N]: rows of the mini-batch whose loss and gradient are exactly 0."""
        return torch.zeros(mini.size, dtype=torch.bool)  # cpu: like the batch it indexes

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        """The micro-batch's share of the mini-batch loss (normalised by `norms`) and per-token metrics,
        from the forward's outputs (`forward` says which)."""
        raise NotImplementedError

    def finish(self, batch: Batch) -> Metrics:
        """Metrics over the whole prepared batch, after the update."""
        return {}

    def normalizer(self, counts: Metrics) -> float | None:
        """What `loss` divides by for a mini-batch with these counts (`loss_normalizers`), when
        loss(UNIT counts) / normalizer = loss(counts): then the update can be streamed
        (`upslope.train.learner.stream`); None: it cannot."""
        return None

    def forget_last(self) -> None:
        """The last `loss` was a zero-weighted repeat run only to keep FSDP's collectives in
        step across ranks (`Updater.rank_micro_batches`): drop whatever it recorded."""


def on_host(record: Any) -> Any:
    """A named tuple of tensors, each detached onto the CPU (to keep, or send to rank 0)."""
    return type(record)._make(t.detach().cpu() for t in record)


class PairRecords:
    """What a pair objective keeps of each micro-batch during an update (detached, on the CPU) for
    its batch metrics; across learner ranks each rank saw only its own micro-batches, so `all`
    gathers every rank's (a collective)."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def clear(self) -> None:
        self.items = []

    def add(self, item: Any) -> None:
        self.items.append(item)

    def drop_last(self) -> None:
        self.items.pop()

    def all(self) -> list[Any]:
        """Every rank's records (this process's alone in one process)."""
        from upslope.distributed import group

        return group.gather_lists(self.items)


class SupervisedObjective(Objective):
    """SFT and RFT: token-mean NLL (or DFT) over loss_mask."""

    def __init__(self, dft: bool):
        self.dft = dft

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        from upslope.algos.sft import sft_loss

        assert isinstance(out, HeadOutput)
        loss, metrics = sft_loss(out.logprobs, mb.loss_mask, num_tokens=norms["num_tokens"], dft=self.dft)
        return LossOutputs(loss, {k: float(v) for k, v in metrics.items()})


def several_passes(train: TrainConfig) -> bool:
    """More than one optimiser step per batch (later steps see samples of an older policy)?"""
    return train.updates_per_batch * train.epochs_per_batch > 1


def loss_terms(algo: AlgoConfig) -> list[LossTerm]:
    """The RL loss's terms in order: the policy loss, the importance correction (algo.correction),
    the registered terms of algo.terms, KL to the reference (algo.kl_coef with kl_in=loss), the entropy
    bonus (algo.entropy_coef) and the mismatch metric."""
    entry = POLICY_LOSSES.get(algo.policy_loss.name, "algo.policy_loss.name")
    traits = entry.traits
    terms: list[LossTerm] = [PolicyTerm(POLICY_LOSSES.bind(algo.policy_loss.name, algo.policy_loss.options,
                                                           where="algo.policy_loss.options"),
                                        zero_at_zero_advantage=traits.zero_at_zero_advantage,
                                        token_stats=traits.token_stats, top_k=traits.top_k)]
    if algo.correction is not None:
        terms.append(LOSS_TERMS.bind("tis", algo.correction.model_dump(), where="algo.correction")())
    terms += [LOSS_TERMS.bind(t.name, t.options, where=f"algo.terms[{i}].options")() for i, t in enumerate(algo.terms)]
    if algo.kl_coef > 0 and algo.kl_in == "loss":
        terms.append(LOSS_TERMS.bind("kl", {"coef": algo.kl_coef, "estimator": algo.kl_estimator,
                                            "target": algo.kl_target, "horizon": algo.kl_horizon},
                                     where="algo.kl_coef")())
    if algo.entropy_coef:
        terms.append(LOSS_TERMS.bind("entropy", {"coef": algo.entropy_coef}, where="algo.entropy_coef")())
    terms.append(LOSS_TERMS.bind("mismatch")())
    return terms


class RLObjective(Objective):
    """Online RL: the sum of the loss terms over the policy's log-probs (`loss_terms`), aggregated as
    algo.loss_agg. The policy loss's ratio is taken against algo.old_policy: the learner's weights
    before the update (the batch's old log-probs, or this forward's with one update per batch) or the
    sampler's log-probs."""

    def __init__(self, terms: Sequence[LossTerm], *, loss_agg: str, constant: float, temperature: float,
                 old_policy: str = "learner", several: bool = False, skip_zero_advantage: bool = True,
                 truncation: Truncation = Truncation()):
        self.terms = list(terms)
        self.loss_agg, self.constant, self.old_policy = loss_agg, constant, old_policy
        self.forward = Forward(temperature=temperature, entropy_grad=any(t.entropy_grad for t in terms),
                               top_k=max(t.top_k for t in terms), truncation=truncation)
        self.skips_rows = skip_zero_advantage and all(t.zero_at_zero_advantage for t in terms)
        self.needs_old_logprobs = several or any(t.needs_old_logprobs for t in terms)
        self.needs_reference = any(t.needs_reference for t in terms)

    @classmethod
    def from_config(cls, cfg: Config) -> "RLObjective":
        """The RL objective of a run's config (its algo and train sections, sampling temperature and length)."""
        algo = cfg.algo
        return cls(loss_terms(algo), loss_agg=algo.loss_agg,
                   constant=algo.loss_agg_constant or float(cfg.rollout.max_new_tokens or 0),
                   temperature=cfg.rollout.temperature or 1.0, old_policy=algo.old_policy,
                   several=several_passes(cfg.train), skip_zero_advantage=cfg.train.skip_zero_advantage,
                   truncation=Truncation(cfg.rollout.top_p, cfg.rollout.top_k))

    def prepare(self, batch: Batch) -> Batch:
        for term in self.terms:
            batch = term.prepare(batch)
        return batch

    def skip_rows(self, mini: Batch) -> torch.Tensor:
        return zero_advantage_rows(mini)

    def ratio_base(self, mb: Batch, logprobs: torch.Tensor) -> torch.Tensor:
        """The log-probs the policy loss's ratio is taken against (algo.old_policy)."""
        if self.old_policy == "sampler":  # behaviour-policy ratio: the weights that generated the samples
            return mb.sampler_logprobs
        return mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()

    def inputs(self, out: HeadOutput, mb: Batch) -> LossInputs:
        """What the terms read: this forward's outputs and the micro-batch's tensors."""
        assert mb.advantages is not None
        return LossInputs(logprobs=out.logprobs, old_logprobs=self.ratio_base(mb, out.logprobs),
                          sampler_logprobs=mb.sampler_logprobs, advantages=mb.advantages, mask=mb.loss_mask,
                          entropy=out.entropy, ref_logprobs=mb.ref_logprobs, topk_logprobs=out.topk_logprobs)

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        assert isinstance(out, HeadOutput)
        per_token, metrics = sum_terms(self.terms, self.inputs(out, mb))
        loss = aggregate(per_token, mb.loss_mask, self.loss_agg, num_tokens=norms["num_tokens"],
                         num_seqs=norms["num_seqs"], constant=self.constant)
        return LossOutputs(loss, metrics)

    def normalizer(self, counts: Metrics) -> float | None:
        """Every term is in the `aggregate` of algo.loss_agg, so its normaliser is the loss's."""
        return normalizer(self.loss_agg, num_tokens=counts["num_tokens"], num_seqs=counts["num_seqs"])

    def finish(self, batch: Batch) -> Metrics:
        out: Metrics = {}
        for term in self.terms:
            out.update(term.finish(batch))
        return out

    def after_update(self, metrics: Metrics, samples: int) -> Metrics:
        """Once per step after the update: the terms' step-level work (an adaptive KL coefficient,
        DCMDP's multiplier), given the step's metrics and its number of samples."""
        out: Metrics = {}
        for term in self.terms:
            out.update(term.after_update(metrics, samples))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Each stateful term's state (what a resume needs), by its position in the loss."""
        return {str(i): s for i, term in enumerate(self.terms) if (s := term.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, term in enumerate(self.terms):
            if str(i) in state:
                term.load_state_dict(state[str(i)])


class DistillObjective(Objective):
    """On-policy distillation toward the teacher's scores on the batch (a distill_loss plugin),
    with the student's log-probs at the teacher's top-k ids from the same forward."""

    def __init__(self, loss_fn: Callable[..., Any], algo: AlgoConfig, train: TrainConfig, *, temperature: float,
                 max_new_tokens: int):
        self.loss_fn, self.algo = loss_fn, algo
        self.forward = Forward(temperature=temperature, entropy_grad=bool(algo.entropy_coef), gather="teacher_topk_ids")
        self.needs_old_logprobs = several_passes(train)  # later updates see samples of an older student
        self.constant = algo.loss_agg_constant or float(max_new_tokens)

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        from upslope.algos.distill import DistillInputs, distill_metrics

        assert isinstance(out, HeadOutput)
        x = DistillInputs(out.logprobs, mb.teacher_logprobs, mb.loss_mask, out.gathered, mb.teacher_topk_logprobs,
                          mb.old_logprobs)
        per_token, loss_metrics = self.loss_fn(x)
        if self.algo.entropy_coef:
            per_token = per_token - self.algo.entropy_coef * out.entropy
        loss = aggregate(per_token, mb.loss_mask, self.algo.loss_agg, num_tokens=norms["num_tokens"],
                         num_seqs=norms["num_seqs"], constant=self.constant)
        return LossOutputs(loss, {**distill_metrics(x), **loss_metrics})


class PreferenceObjective(Objective):
    """DPO, IPO, SimPO (a preference_loss plugin) over pair rows: micro-batches hold whole pairs;
    the per-pair outputs seen during the update become its preference metrics."""

    whole_groups = True

    def __init__(self, loss_fn: Callable[..., Any]):
        self.loss_fn = loss_fn
        self.seen = PairRecords()  # (loss output, policy log-probs) of each micro-batch's pairs

    def prepare(self, batch: Batch) -> Batch:
        self.seen.clear()
        return batch

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        from upslope.train.methods.pair_batch import sequence_logps

        assert isinstance(out, HeadOutput)
        policy = sequence_logps(out.logprobs, mb)
        reference = sequence_logps(mb.ref_logprobs, mb) if mb.ref_logprobs is not None else None
        pairs = self.loss_fn(policy, reference)
        self.seen.add((on_host(pairs), on_host(policy)))
        # every row has >= 1 trained token (a reply ends with its end token), so pairs = rows / 2
        return LossOutputs(pairs.loss.sum() / max(norms["num_seqs"] / 2, 1.0), {})

    def forget_last(self) -> None:
        self.seen.drop_last()

    def finish(self, batch: Batch) -> Metrics:
        from upslope.algos.preference import preference_metrics

        seen = self.seen.all()
        return preference_metrics([out for out, _ in seen], [policy for _, policy in seen])


class ValueObjective(Objective):
    """PPO's critic on its token values (a scalar head, `upslope.scalar_head`): 0.5 * max((V - R)^2,
    (V_clipped - R)^2), token mean, with V_clipped the new value kept within `value_clip` of the old one
    (batch.values); no clip when None."""

    forward = Forward(head="token_values")

    def __init__(self, value_clip: float | None):
        self.value_clip = value_clip

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        assert isinstance(out, torch.Tensor)
        assert mb.returns is not None and mb.values is not None, "the value loss needs batch.values and returns"
        err = (out - mb.returns) ** 2
        clipped = 0.0
        if self.value_clip is not None:
            v_clip = mb.values + (out - mb.values).clamp(-self.value_clip, self.value_clip)
            err_clip = (v_clip - mb.returns) ** 2
            clipped = float(((err_clip > err).float() * mb.loss_mask).sum())
            err = torch.maximum(err, err_clip)
        loss = aggregate(0.5 * err, mb.loss_mask, "token_mean", num_tokens=norms["num_tokens"],
                         num_seqs=norms["num_seqs"])
        return LossOutputs(loss, {"clip_frac": clipped / max(float(mb.loss_mask.sum()), 1.0)})


class BradleyTerryObjective(Objective):
    """Reward-model training on pair rows (a group of two: chosen and rejected, the higher
    `rewards` value is the chosen one) scored by a scalar head's sequence scores: the mean
    Bradley-Terry loss over the mini-batch's pairs. Each pair's scores seen during the update give
    the pairwise accuracy and score margin."""

    forward = Forward(head="sequence_scores")
    whole_groups = True

    def __init__(self, margin: float = 0.0):
        self.margin = margin
        self.seen = PairRecords()  # (chosen, rejected) scores of each micro-batch's pairs

    def prepare(self, batch: Batch) -> Batch:
        self.seen.clear()
        return batch

    def forget_last(self) -> None:
        self.seen.drop_last()

    def loss(self, out: ModelOutputs, mb: Batch, norms: Metrics) -> LossOutputs:
        from upslope.train.methods.pair_batch import pair_rows

        assert isinstance(out, torch.Tensor) and mb.rewards is not None
        chosen, rejected = pair_rows(mb.group_ids.cpu(), mb.rewards.cpu())
        rc, rr = out[chosen.to(out.device)], out[rejected.to(out.device)]
        self.seen.add((rc.detach().cpu(), rr.detach().cpu()))
        return LossOutputs(bradley_terry_loss(rc - rr - self.margin).sum() / max(norms["num_seqs"] / 2, 1.0), {})

    def finish(self, batch: Batch) -> Metrics:
        seen = self.seen.all()
        if not seen:
            return {}
        return pair_metrics(torch.cat([c for c, _ in seen]), torch.cat([r for _, r in seen]))


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> Metrics:
    """Pairwise accuracy (chosen scored strictly higher; a tie counts half), mean score gap and mean score."""
    diff = chosen - rejected
    acc = (diff > 0).float().mean() + 0.5 * (diff == 0).float().mean()
    return {"rm/accuracy": float(acc), "rm/margin": float(diff.mean()),
            "rm/score_mean": float(torch.cat([chosen, rejected]).mean())}
