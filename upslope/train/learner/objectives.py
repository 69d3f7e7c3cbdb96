"""What an update optimises: one objective per method, passed by its trainer to
`Updater.update`. An objective scores micro-batches (`loss`), may prepare the batch first
(old log-probs), skip rows whose loss is exactly zero, gather extra log-probs in the same
forward, and add metrics over the whole batch (`finish`)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from upslope.algos.aggregate import aggregate, normalizer
from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio
from upslope.algos.correction import importance_correction
from upslope.algos.preference import bradley_terry_loss
from upslope.algos.kl import AdaptiveKLController, FixedKLController, kl_penalty_in_reward
from upslope.algos.trust import DualController, discrepancy, proxy_parts
from upslope.batch import Batch
from upslope.config import AlgoConfig, TrainConfig
from upslope.registry import KL_ESTIMATORS, POLICY_LOSSES

if TYPE_CHECKING:
    from upslope.train.learner.updater import Updater

Metrics = dict[str, float]


def mismatch(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |log p_learner - log p_sampler| over the trained tokens; the gap is clamped as the
    losses clamp log-ratios (both -inf counts as 0), so the metric is never NaN."""
    gap = clamp_log_ratio(logprobs - sampler_logprobs, MAX_LOG_RATIO).abs()
    return float((gap * mask).sum()) / max(float(mask.sum()), 1.0)


def zero_advantage_rows(batch: Batch) -> torch.Tensor:
    """bool [N]: rows whose advantage is 0 at every trained token (e.g. a GRPO group whose
    samples all got the same reward)."""
    assert batch.advantages is not None
    return ((batch.advantages != 0) & (batch.loss_mask > 0)).sum(dim=1) == 0


class Objective:
    """The default hooks: log-probs at temperature 1 (the model's own distribution), no
    preparation, no skipped rows, no gathered ids, micro-batches free to split groups."""

    temperature: float = 1.0
    entropy_grad: bool = False  # does the loss back-propagate through the entropy?
    whole_groups: bool = False  # must every micro-batch hold whole groups (pairs)?
    skips_rows: bool = False  # may rows with exactly zero loss be left out of the forward?

    def prepare(self, batch: Batch, updater: "Updater") -> Batch:
        """The batch the update runs on (e.g. with old log-probs for several optimiser steps)."""
        return batch

    def skip_rows(self, mini: Batch) -> torch.Tensor:
        """bool [N]: rows of the mini-batch whose loss and gradient are exactly 0."""
        return torch.zeros(mini.size, dtype=torch.bool)  # cpu: like the batch it indexes

    def gather_ids(self, mb: Batch) -> torch.Tensor | None:
        """Token ids [n, L, K] whose policy log-probs the loss also needs (None: none)."""
        return None

    def micro_step(self, updater: "Updater", mb: Batch, norms: Metrics) -> tuple[torch.Tensor, Metrics, float | None]:
        """One micro-batch (on the updater's device) through the model: its loss, per-token
        metrics and summed token entropy (None where the model has no LM head). By default the
        policy's log-probs and entropies go to `loss`; a scalar-head objective overrides it."""
        out = updater.forward(updater.model, mb, temperature=self.temperature, entropy_grad=self.entropy_grad,
                              gather_ids=self.gather_ids(mb))
        loss, metrics = self.loss(out.logprobs, out.entropy, mb, norms, out.gathered)
        return loss, metrics, float((out.entropy * mb.loss_mask).sum())

    def loss(self, lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: Metrics,
             gathered: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
        """The micro-batch's share of the mini-batch loss (normalised by `norms`) and per-token metrics."""
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
        """The last `micro_step` was a zero-weighted repeat run only to keep FSDP's collectives in
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

    def loss(self, lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: Metrics,
             gathered: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
        from upslope.algos.sft import sft_loss

        loss, metrics = sft_loss(lp, mb.loss_mask, num_tokens=norms["num_tokens"], dft=self.dft)
        return loss, {k: float(v) for k, v in metrics.items()}


class FunctionObjective(Objective):
    """An objective from a plain loss function `fn(lp, ent, mb, norms) -> (loss, metrics)` (e.g.
    a preference loss over pair rows), with its hooks' settings as keywords."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor, Batch, Metrics], tuple[torch.Tensor, Metrics]],
                 *, whole_groups: bool = False, temperature: float = 1.0):
        self.fn, self.whole_groups, self.temperature = fn, whole_groups, temperature

    def loss(self, lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: Metrics,
             gathered: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
        return self.fn(lp, ent, mb, norms)


def several_passes(train: TrainConfig) -> bool:
    """More than one optimiser step per batch (later steps see samples of an older policy)?"""
    return train.updates_per_batch * train.epochs_per_batch > 1


class RLObjective(Objective):
    """Online RL: the configured policy loss on the advantages, with importance correction
    against the sampler, KL to the frozen reference (in the loss, or folded into the reward
    by `with_reference`) and an entropy bonus, aggregated as algo.loss_agg."""

    def __init__(self, algo: AlgoConfig, train: TrainConfig, updater: "Updater", *, temperature: float,
                 max_new_tokens: int):
        self.algo, self.train, self.updater = algo, train, updater
        self.temperature = temperature
        self.entropy_grad = bool(algo.entropy_coef)
        self.uses_reference = algo.kl_coef > 0  # no reference model at all unless KL is used
        if self.uses_reference:
            updater.reference()
            self.kl_fn = KL_ESTIMATORS.bind(algo.kl_estimator, where="algo.kl_estimator")
        self.kl_ctl = (AdaptiveKLController(algo.kl_coef, algo.kl_target, algo.kl_horizon) if algo.kl_target
                       else FixedKLController(algo.kl_coef))
        d = algo.discrepancy
        self.dual = DualController(d.init, d.lr, d.tolerance) if d is not None else None
        self.policy_loss = POLICY_LOSSES.bind(algo.policy_loss.name, algo.policy_loss.options,
                                              where="algo.policy_loss.options")
        loss_attrs = POLICY_LOSSES.get(algo.policy_loss.name).attrs  # token_stats: entropy, top-k from this forward
        self.token_stats, self.top_k = bool(loss_attrs.get("token_stats")), int(loss_attrs.get("top_k", 0))
        self.entropy_grad = self.entropy_grad or self.token_stats
        self.stats: dict[str, torch.Tensor] = {}
        self.one_pass = not several_passes(train)
        self.constant = algo.loss_agg_constant or float(max_new_tokens)
        self.kl_in_loss = self.uses_reference and algo.kl_in == "loss"
        self.skips_rows = (train.skip_zero_advantage and not self.kl_in_loss and not algo.entropy_coef
                           and self.dual is None
                           and bool(POLICY_LOSSES.get(algo.policy_loss.name).attrs.get("zero_at_zero_advantage")))
        c = algo.correction
        self.rejects = c is not None and (c.mask_low is not None or c.mask_high is not None)
        self.rejection = {"units": 0.0, "rejected": 0.0}  # the update's correction units (tokens or rows), rejected

    @classmethod
    def from_config(cls, cfg: Any, updater: "Updater") -> "RLObjective":
        """The RL objective of a run's config (its algo and train sections, sampling temperature and length)."""
        return cls(cfg.algo, cfg.train, updater, temperature=cfg.rollout.temperature or 1.0,
                   max_new_tokens=cfg.rollout.max_new_tokens or 0)

    # ------------------------------------------------------------------ before and after the update

    def with_reference(self, batch: Batch) -> tuple[Batch, float | None]:
        """The batch with the reference's log-probs and, with algo.kl_in=reward, old log-probs
        and -beta * KL folded into the rewards (returns that KL); unchanged without a reference."""
        if not self.uses_reference:
            return batch, None
        batch = replace(batch, ref_logprobs=self.updater.logprobs(batch, temperature=self.temperature,
                                                                  reference=True))
        if self.algo.kl_in != "reward":
            return batch, None
        batch = replace(batch, old_logprobs=self.updater.logprobs(batch, temperature=self.temperature))
        return kl_penalty_in_reward(batch, self.kl_fn, self.kl_ctl.value)

    def after_update(self, kl: float, samples: int, discrepancy: float | None = None) -> Metrics:
        """The KL coefficient and DCMDP multiplier this step used; then adaptive KL moves the
        coefficient toward its target and dual ascent moves the multiplier by `discrepancy`."""
        out: Metrics = {}
        if self.uses_reference:
            out["kl_coef"] = self.kl_ctl.value
            self.kl_ctl.update(kl, samples)
        if self.dual is not None:
            out["dcmdp/lambda"] = self.dual.value
            if discrepancy is not None:
                self.dual.update(discrepancy)
        return out

    def state(self) -> dict[str, Any]:
        """What must survive a resume: the (adaptive) KL coefficient and the DCMDP multiplier."""
        return {"kl_coef": self.kl_ctl.value, "dual": self.dual.state_dict() if self.dual is not None else None}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what `state` saved (a checkpoint from before DCMDP was enabled keeps lambda's init)."""
        self.kl_ctl.value = float(state["kl_coef"])
        if self.dual is not None and state.get("dual") is not None:
            self.dual.load_state_dict(state["dual"])

    def candidate(self, updater: "Updater") -> dict[str, Any] | None:
        """With algo.accept (MIPU), what a vetoed update restores: trainable weights and optimiser
        state before it (a copy, in memory); None otherwise."""
        if self.algo.accept is None:
            return None
        import copy

        weights = {n: p.detach().clone() for n, p in updater.model.named_parameters() if p.requires_grad}
        return {"weights": weights, "state": copy.deepcopy(updater.state())}

    def accept(self, batch: Batch, updater: "Updater", saved: dict[str, Any] | None) -> Metrics:
        """MIPU: score the updated (candidate) policy on the batch against the sampler's log-probs
        (`trust.improvement_proxy`, one extra forward) and restore `saved` unless it improves."""
        if saved is None or self.algo.accept is None:
            return {}
        a = self.algo.accept
        assert batch.advantages is not None
        lp = updater.logprobs(batch, temperature=self.temperature)
        gain, gap = proxy_parts(lp, batch.sampler_logprobs, batch.advantages, batch.loss_mask)
        proxy = gain - a.gap_coef * gap
        accepted = proxy > a.min_gain
        if not accepted:
            with torch.no_grad():
                for n, p in updater.model.named_parameters():
                    if n in saved["weights"]:
                        p.copy_(saved["weights"][n])
            updater.load_state(saved["state"])
        return {"mipu/proxy": proxy, "mipu/gain": gain, "mipu/gap": gap, "mipu/accepted": float(accepted)}

    # ------------------------------------------------------------------ Objective hooks

    def prepare(self, batch: Batch, updater: "Updater") -> Batch:
        """Old log-probs cost a forward pass only when there is more than one optimiser step per batch,
        or when the importance correction rejects tokens (mask_low / mask_high): those are known
        before the update, and leave the loss mask here, before the loss's normalisers count it."""
        if (not self.one_pass or self.rejects) and batch.old_logprobs is None:
            batch = replace(batch, old_logprobs=updater.logprobs(batch, temperature=self.temperature))
        return self._without_rejected(batch) if self.rejects else batch

    def _old(self, mb: Batch, lp: torch.Tensor) -> torch.Tensor:
        """The log-probs the policy loss's ratio is taken against (algo.old_policy)."""
        if self.algo.old_policy == "sampler":  # behaviour-policy ratio: the weights that generated the samples
            return mb.sampler_logprobs
        return mb.old_logprobs if mb.old_logprobs is not None else lp.detach()

    def _without_rejected(self, batch: Batch) -> Batch:
        """The batch whose loss mask drops the tokens (token level) or rows (sequence levels) whose
        ratio to the sampler is outside [mask_low, mask_high]: they are not trained and count in no
        normaliser, as in verl's rollout rejection. Counts them for the update's `tis/masked_frac`."""
        c = self.algo.correction
        assert c is not None and batch.old_logprobs is not None
        _, kept, _ = importance_correction(self._old(batch, batch.old_logprobs), batch.sampler_logprobs,
                                           batch.loss_mask, level=c.level, cap=c.cap, mask_low=c.mask_low,
                                           mask_high=c.mask_high)
        before, after = batch.loss_mask > 0, kept > 0
        if c.level != "token":  # the sequence levels reject whole rows: count rows with a trained token
            before, after = before.any(dim=1), after.any(dim=1)
        self.rejection["units"] += float(before.sum())
        self.rejection["rejected"] += float((before & ~after).sum())
        return replace(batch, loss_mask=kept)

    def skip_rows(self, mini: Batch) -> torch.Tensor:
        return zero_advantage_rows(mini)

    def micro_step(self, updater: "Updater", mb: Batch, norms: Metrics) -> tuple[torch.Tensor, Metrics, float | None]:
        """The default forward; a `token_stats` policy loss also gets this forward's entropy and top-k log-probs."""
        if not self.token_stats:
            return super().micro_step(updater, mb, norms)
        out = updater.forward(updater.model, mb, temperature=self.temperature, entropy_grad=True, top_k=self.top_k)
        self.stats = {"entropy": out.entropy, "topk_logprobs": out.topk_logprobs}
        loss, metrics = self.loss(out.logprobs, out.entropy, mb, norms, out.gathered)
        return loss, metrics, float((out.entropy.detach() * mb.loss_mask).sum())

    def loss(self, lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: Metrics,
             gathered: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
        algo, mask = self.algo, mb.loss_mask
        old = self._old(mb, lp)
        per_token, metrics = self.policy_loss(lp, old, mb.advantages, mask, **self.stats)
        metrics = dict(metrics)
        if algo.correction is not None:
            c = algo.correction
            weights, _, cm = importance_correction(old, mb.sampler_logprobs, mask, level=c.level, cap=c.cap,
                                                   mask_low=c.mask_low, mask_high=c.mask_high)
            per_token = per_token * weights  # masked tokens have weight 0
            metrics.update({"tis/capped_frac": cm["capped_frac"], "tis/masked_frac": cm["masked_frac"]})
        ntok = max(float(mask.sum()), 1.0)
        if self.dual is not None:
            disc = discrepancy(lp, mb.sampler_logprobs)
            per_token = per_token + self.dual.value * disc
            metrics["dcmdp/discrepancy"] = float((disc.detach() * mask).sum()) / ntok
        if self.kl_in_loss:
            kl = self.kl_fn(lp, mb.ref_logprobs)
            per_token = per_token + self.kl_ctl.value * kl
            metrics["kl"] = float((kl.detach() * mask).sum()) / ntok
        if algo.entropy_coef:
            per_token = per_token - algo.entropy_coef * ent
        if self.one_pass:  # this forward is the policy that was sampled
            metrics["mismatch"] = mismatch(lp.detach(), mb.sampler_logprobs, mask)
        loss = aggregate(per_token, mask, algo.loss_agg, num_tokens=norms["num_tokens"],
                         num_seqs=norms["num_seqs"], constant=self.constant)
        return loss, metrics

    def normalizer(self, counts: Metrics) -> float | None:
        """Every term is in the `aggregate` of algo.loss_agg, so its normaliser is the loss's."""
        return normalizer(self.algo.loss_agg, num_tokens=counts["num_tokens"], num_seqs=counts["num_seqs"])

    def finish(self, batch: Batch) -> Metrics:
        out: Metrics = {}
        if self.rejects:  # what prepare rejected (the micro-batches saw only the kept tokens)
            out["tis/masked_frac"] = self.rejection["rejected"] / max(self.rejection["units"], 1.0)
            self.rejection = {"units": 0.0, "rejected": 0.0}
        if batch.old_logprobs is not None:
            out["mismatch"] = mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask)
        return out


class DistillObjective(Objective):
    """On-policy distillation toward the teacher's scores on the batch (a distill_loss plugin),
    with the student's log-probs at the teacher's top-k ids from the same forward."""

    def __init__(self, loss_fn: Callable[..., Any], algo: AlgoConfig, train: TrainConfig, *, temperature: float,
                 max_new_tokens: int):
        self.loss_fn, self.algo = loss_fn, algo
        self.temperature = temperature
        self.entropy_grad = bool(algo.entropy_coef)
        self.several = several_passes(train)
        self.constant = algo.loss_agg_constant or float(max_new_tokens)

    def prepare(self, batch: Batch, updater: "Updater") -> Batch:
        """Later updates see samples of an older student: keep its log-probs."""
        if self.several:
            batch = replace(batch, old_logprobs=updater.logprobs(batch, temperature=self.temperature))
        return batch

    def gather_ids(self, mb: Batch) -> torch.Tensor | None:
        return mb.teacher_topk_ids

    def loss(self, lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: Metrics,
             gathered: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
        from upslope.algos.distill import DistillInputs, distill_metrics

        x = DistillInputs(lp, mb.teacher_logprobs, mb.loss_mask, gathered, mb.teacher_topk_logprobs, mb.old_logprobs)
        per_token, loss_metrics = self.loss_fn(x)
        if self.algo.entropy_coef:
            per_token = per_token - self.algo.entropy_coef * ent
        loss = aggregate(per_token, mb.loss_mask, self.algo.loss_agg, num_tokens=norms["num_tokens"],
                         num_seqs=norms["num_seqs"], constant=self.constant)
        return loss, {**distill_metrics(x), **loss_metrics}


class PreferenceObjective(Objective):
    """DPO, IPO, SimPO (a preference_loss plugin) over pair rows: micro-batches hold whole pairs;
    the per-pair outputs seen during the update become its preference metrics."""

    whole_groups = True

    def __init__(self, loss_fn: Callable[..., Any]):
        self.loss_fn = loss_fn
        self.seen = PairRecords()  # (loss output, policy log-probs) of each micro-batch's pairs

    def prepare(self, batch: Batch, updater: "Updater") -> Batch:
        self.seen.clear()
        return batch

    def loss(self, lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: Metrics,
             gathered: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
        from upslope.train.methods.pair_batch import sequence_logps

        policy = sequence_logps(lp, mb)
        reference = sequence_logps(mb.ref_logprobs, mb) if mb.ref_logprobs is not None else None
        out = self.loss_fn(policy, reference)
        self.seen.add((on_host(out), on_host(policy)))
        # every row has >= 1 trained token (a reply ends with its end token), so pairs = rows / 2
        return out.loss.sum() / max(norms["num_seqs"] / 2, 1.0), {}

    def forget_last(self) -> None:
        self.seen.drop_last()

    def finish(self, batch: Batch) -> Metrics:
        from upslope.algos.preference import preference_metrics

        seen = self.seen.all()
        return preference_metrics([out for out, _ in seen], [policy for _, policy in seen])


class ScalarObjective(Objective):
    """An objective over a scalar-head model (`upslope.scalar_head`): the head's
    outputs under the updater's precision go to `scalar_loss`; there are no log-probs."""

    def micro_step(self, updater: "Updater", mb: Batch, norms: Metrics) -> tuple[torch.Tensor, Metrics, float | None]:
        with updater.autocast():
            out = self.forward(updater.model, mb)
        loss, metrics = self.scalar_loss(out, mb, norms)
        return loss, metrics, None

    def forward(self, model: Any, mb: Batch) -> torch.Tensor:
        """The head's outputs the loss needs (fp32)."""
        raise NotImplementedError

    def scalar_loss(self, out: torch.Tensor, mb: Batch, norms: Metrics) -> tuple[torch.Tensor, Metrics]:
        """The micro-batch's share of the mini-batch loss and its per-token metrics."""
        raise NotImplementedError


def token_values(model: Any, mb: Batch) -> torch.Tensor:
    """[n, L] values aligned to tokens: values[:, t] = V(the state that chooses token t), 0 off loss_mask."""
    v = model.token_values(mb.input_ids, mb.attention_mask)
    return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], 1) * mb.loss_mask


class ValueObjective(ScalarObjective):
    """PPO's critic: 0.5 * max((V - R)^2, (V_clipped - R)^2), token mean, with V_clipped the
    new value kept within `value_clip` of the old one (batch.values); no clip when None."""

    def __init__(self, value_clip: float | None):
        self.value_clip = value_clip

    def forward(self, model: Any, mb: Batch) -> torch.Tensor:
        return token_values(model, mb)

    def scalar_loss(self, out: torch.Tensor, mb: Batch, norms: Metrics) -> tuple[torch.Tensor, Metrics]:
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
        return loss, {"clip_frac": clipped / max(float(mb.loss_mask.sum()), 1.0)}


class BradleyTerryObjective(ScalarObjective):
    """Reward-model training on pair rows (a group of two: chosen and rejected, the higher
    `rewards` value is the chosen one): the mean Bradley-Terry loss over the mini-batch's pairs.
    Each pair's scores seen during the update give the pairwise accuracy and score margin."""

    whole_groups = True

    def __init__(self, margin: float = 0.0):
        self.margin = margin
        self.seen = PairRecords()  # (chosen, rejected) scores of each micro-batch's pairs

    def prepare(self, batch: Batch, updater: "Updater") -> Batch:
        self.seen.clear()
        return batch

    def forget_last(self) -> None:
        self.seen.drop_last()

    def forward(self, model: Any, mb: Batch) -> torch.Tensor:
        return model.sequence_scores(mb.input_ids, mb.attention_mask)

    def scalar_loss(self, out: torch.Tensor, mb: Batch, norms: Metrics) -> tuple[torch.Tensor, Metrics]:
        from upslope.train.methods.pair_batch import pair_rows

        assert mb.rewards is not None
        chosen, rejected = pair_rows(mb.group_ids.cpu(), mb.rewards.cpu())
        rc, rr = out[chosen.to(out.device)], out[rejected.to(out.device)]
        self.seen.add((rc.detach().cpu(), rr.detach().cpu()))
        loss = bradley_terry_loss(rc - rr - self.margin).sum() / max(norms["num_seqs"] / 2, 1.0)
        return loss, {}

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
