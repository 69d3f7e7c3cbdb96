"""`upslope train`: online RL (GRPO and every recipe of the algorithm set) on the shared loop:
collect (rollout -> reward -> filter) -> prepare (overlong mask, reference and KL, critic values,
advantages) -> update with the RL objective -> weight sync."""
from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

from upslope import checkpoint as ckpt
from upslope.batch import Batch
from upslope.config import Config
from upslope.errors import ConfigError, UpslopeError
from upslope.algos.kl import KLControl, kl_penalty_in_reward
from upslope.algos.terms import KLPenalty
from upslope.algos.trust import DiscrepancyConstraint
from upslope.registry import ACCEPTS, ADVANTAGES, FILTERS, REPLAY, REWARD_COMBINERS, REWARDS, ROLLOUTS, SAMPLERS
from upslope.train import stages
from upslope.train.collect import Rounds
from upslope.train.guards import mismatch_warning
from upslope.train.learner.logprobs import Truncation
from upslope.train.learner.objectives import RLObjective, several_passes
from upslope.train.learner.stream import Prepared, StreamedUpdate
from upslope.train.learner.updater import Updater
from upslope.seeding import seed_step
from upslope.train.loop import BaseTrainer
from upslope.train.pipeline import staleness_warning
from upslope.train.sources import BatchSource, WeightSink


def advantage_metrics(batch: Batch) -> dict[str, float]:
    """The adv/ statistics of a prepared batch."""
    return {k: v for k, v in stages.rollout_metrics(batch).items() if k.startswith("adv/")}


def check_config(cfg: Config) -> None:
    """Reject RL option combinations that cannot run (one ConfigError line)."""
    if ADVANTAGES.get(cfg.algo.advantage.name, "algo.advantage.name").traits.grouped and cfg.rollout.n < 2:
        raise ConfigError(f"rollout.n={cfg.rollout.n}: advantage '{cfg.algo.advantage.name}' compares completions "
                          f"within a group, so it needs rollout.n >= 2")
    check_token_rewards(cfg)
    features = ADVANTAGES.get(cfg.algo.advantage.name).traits.features
    if features and cfg.dist.learner_procs > 1:
        from upslope.train.learner.salience import FEATURES

        if getattr(FEATURES[features], "whole_batch", False):  # per-row gradients over the whole batch, one process
            raise ConfigError(f"dist.learner_procs={cfg.dist.learner_procs}: advantage '{cfg.algo.advantage.name}' "
                              f"reads '{features}', a pass over the whole batch on one learner process; use 1")
    if cfg.algo.replay is not None:  # its options fail here, before any model loads
        REPLAY.bind(cfg.algo.replay.name, cfg.algo.replay.options, where="algo.replay.options")
    SAMPLERS.bind(cfg.data.sampler.name, cfg.data.sampler.options, where="data.sampler.options")
    if not ROLLOUTS.get(cfg.rollout.kind, "rollout.kind").traits.setup:  # bad rollout.options fail here
        ROLLOUTS.bind(cfg.rollout.kind, cfg.rollout.options, where="rollout.options")
    if cfg.train.updates_per_batch > cfg.rollout.prompts_per_step:
        raise ConfigError(f"train.updates_per_batch={cfg.train.updates_per_batch}: cannot split "
                          f"{cfg.rollout.prompts_per_step} prompt groups into more mini-batches than groups")


def check_token_rewards(cfg: Config) -> None:
    """A reward placed on tokens (trait `places_tokens`, e.g. process with placement: token) needs an
    advantage that reads token rewards (trait `token_rewards`) and a linear combiner (trait `linear`)."""
    from upslope.rewards import places_tokens

    placing = [(i, r.name) for i, r in enumerate(cfg.reward) if places_tokens(r)]
    if not placing:
        return
    i, name = placing[0]
    adv = cfg.algo.advantage.name
    if not ADVANTAGES.get(adv, "algo.advantage.name").traits.token_rewards:
        takes = ", ".join(n for n in ADVANTAGES.names() if ADVANTAGES.get(n).traits.token_rewards)
        raise ConfigError(f"reward[{i}] ({name}) puts rewards on tokens, and advantage '{adv}' reads only sequence "
                          f"rewards; use an advantage that takes token rewards ({takes}) or placement: sequence")
    comb = cfg.algo.reward_combiner.name
    if not REWARD_COMBINERS.get(comb, "algo.reward_combiner.name").traits.linear:
        raise ConfigError(f"reward[{i}] ({name}) puts rewards on tokens, which needs a linear reward combiner (the "
                          f"token rewards are its weighted parts), and algo.reward_combiner '{comb}' is not one; use "
                          f"weighted_sum or placement: sequence")


def stream_blocker(cfg: Config, sampler: Any = None) -> str | None:
    """Why this run's update must wait for its whole batch instead of streaming groups as they arrive
    from the Ray workers (None: it may stream); read from the plugins' `whole_batch` traits (and the
    `sampler`'s `merge_repeats`), never by name."""
    algo = cfg.algo
    if not cfg.pipeline.stream:
        return "pipeline.stream=false"
    if sampler is not None and sampler.merge_repeats:
        return f"sampler '{cfg.data.sampler.name}' makes a prompt's repeated draws one group"
    if several_passes(cfg.train):
        return "several optimiser steps per batch (train.updates_per_batch x train.epochs_per_batch > 1)"
    if ADVANTAGES.get(algo.advantage.name, "algo.advantage.name").traits.whole_batch:
        return f"advantage '{algo.advantage.name}' uses statistics of the whole batch"
    for spec in cfg.reward:  # a reward given as FILE:FUNCTION is per sample or batched over a piece
        if spec.name in REWARDS and REWARDS.get(spec.name).traits.whole_batch:
            return f"reward '{spec.name}' uses statistics of the whole round"
    if REWARD_COMBINERS.get(algo.reward_combiner.name, "algo.reward_combiner.name").traits.whole_batch:
        return f"reward combiner '{algo.reward_combiner.name}' uses statistics of the whole round"
    for f in algo.filters:
        if FILTERS.get(f.name, "algo.filters").traits.whole_batch:
            return f"filter '{f.name}' compares across the whole round"
    if algo.replay is not None:
        return "algo.replay mixes replayed rows into the whole batch"
    return None


def bound_options(plugin: Any) -> dict[str, Any]:
    """Every keyword option of a bound plugin (Registry.bind's partial) with its value: the config's where it set
    one, else the plugin's default. (inspect.signature would follow the partial's __wrapped__ to the plain
    function and show only the defaults.)"""
    import inspect

    given = getattr(plugin, "keywords", {})
    return {k: given.get(k, p.default) for k, p in inspect.signature(inspect.unwrap(plugin)).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def shared_options(advantage_fn: Any, source: Any) -> dict[str, Any]:
    """The bound advantage's options that its features `source` takes too (ISPO's answer_tokens: the answer region
    the pass measures is the one the advantage credits)."""
    import inspect

    options = bound_options(advantage_fn)
    return {k: options[k] for k in inspect.signature(source).parameters if k in options}


def combine_piece_metrics(parts: list[Prepared]) -> dict[str, Any]:
    """What `Trainer.prepare` measured on each streamed piece, as it would have on the whole batch:
    token means (kl) weighted by each piece's trained tokens, `*/seconds` summed. The adv/ statistics
    are not combinable (a std) and are recomputed on the whole prepared batch."""
    tokens = [float(piece.loss_mask.sum()) for piece, _ in parts]
    total = max(sum(tokens), 1.0)
    out: dict[str, Any] = {}
    for (_, measured), n in zip(parts, tokens):
        for k, v in measured.items():
            if not k.startswith("adv/"):
                out[k] = out.get(k, 0.0) + (v if k.endswith("seconds") else v * n / total)
    return out


def with_reference(batch: Batch, updater: Updater, temperature: float, kl_reward: KLControl | None,
                   truncation: Truncation = Truncation()) -> tuple[Batch, float | None]:
    """The batch with the frozen reference's log-probs; with KL in the reward (`kl_reward`), also the
    policy's old log-probs and -beta * KL folded into the rewards, and that KL (else None). Both at the
    sampler's temperature and truncation, as every log-prob the RL learner takes."""
    batch = replace(batch, ref_logprobs=updater.logprobs(batch, temperature=temperature, reference=True,
                                                         truncation=truncation))
    if kl_reward is None:
        return batch, None
    batch = replace(batch, old_logprobs=updater.logprobs(batch, temperature=temperature, truncation=truncation))
    return kl_penalty_in_reward(batch, kl_reward.estimate, kl_reward.value)


def restore_pre_terms_state(old: dict[str, Any], objective: RLObjective, kl_reward: KLControl | None) -> None:
    """A checkpoint written before the loss was a sum of terms kept {kl_coef, dual}: the KL coefficient
    (an adaptive one moves) and DCMDP's multiplier, restored into the terms that hold them now."""
    for term in objective.terms:
        if isinstance(term, KLPenalty):
            term.load_state_dict({"kl_coef": old["kl_coef"]})
        if isinstance(term, DiscrepancyConstraint) and old.get("dual") is not None:
            term.load_state_dict(old["dual"])
    if kl_reward is not None:
        kl_reward.load_state_dict({"kl_coef": old["kl_coef"]})


class Trainer(BaseTrainer):
    """Online RL (GRPO and every recipe of the algorithm set): rollout -> reward -> filter ->
    advantage -> update -> weight sync."""

    def check_config(self) -> None:
        check_config(self.cfg)

    def setup(self) -> None:
        cfg = self.cfg
        self.setup_task()
        self.advantage_fn = ADVANTAGES.bind(cfg.algo.advantage.name, cfg.algo.advantage.options,
                                            where="algo.advantage.options")
        self.salience_source = ADVANTAGES.get(cfg.algo.advantage.name).traits.salience  # the extra pass it needs
        self.features_source = ADVANTAGES.get(cfg.algo.advantage.name).traits.features  # or this one
        self.filters = [FILTERS.bind(f.name, f.options, where=f"algo.filters[{i}].options")
                        for i, f in enumerate(cfg.algo.filters)]
        self.critic = None
        if ADVANTAGES.get(cfg.algo.advantage.name).traits.critic:  # PPO: a value model, only when needed
            from upslope.train.methods.critic import Critic

            self.critic = Critic.from_config(cfg, self.runtime.model_path, self.device)
        replay = cfg.algo.replay
        self.replay = REPLAY.bind(replay.name, replay.options, where="algo.replay.options")() if replay else None
        self.warned_reply_cut = False
        r = cfg.rollout
        self.rounds = Rounds(want=r.prompts_per_step, max_rounds=r.max_resample_rounds if self.filters else 0,
                             merge_repeats=self.merge_repeats)
        self.keep = functools.partial(stages.apply_filters, filters=self.filters)

    def setup_objective(self) -> None:
        algo = self.cfg.algo
        self.objective = RLObjective.from_config(self.cfg)
        self.kl_reward = (KLControl(algo.kl_coef, algo.kl_estimator, algo.kl_target, algo.kl_horizon)
                          if algo.kl_coef > 0 and algo.kl_in == "reward" else None)  # KL folded into the rewards
        self.uses_reference = self.kl_reward is not None or self.objective.needs_reference
        if self.uses_reference:  # no reference model at all unless KL is used
            self.updater.reference()
        accept = algo.accept
        self.accept = ACCEPTS.bind(accept.name, accept.options, where="algo.accept.options")() if accept else None

    def extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"loss_terms": self.objective.state_dict()}
        if self.kl_reward is not None:
            state["kl_in_reward"] = self.kl_reward.state_dict()
        if self.critic is not None:
            state["critic"] = self.critic.state()
        if self.replay is not None:
            state["replay"] = self.replay.state_dict()
        return state

    def save_extra_shards(self, shards: Path) -> None:
        if self.critic is not None:
            self.critic.save_sharded(shards)

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        if self.critic is not None:
            if "critic" not in state:
                raise UpslopeError(f"{path}: checkpoint has no critic state, but algo.advantage needs a critic")
            self.critic.load(state["critic"], path / ckpt.SHARDED)
        if self.replay is not None:
            if "replay" not in state:
                raise UpslopeError(f"{path}: checkpoint has no replay buffer, but algo.replay is set")
            self.replay.load_state_dict(state["replay"])
        if "loss_terms" in state:
            self.objective.load_state_dict(state["loss_terms"])
        if self.kl_reward is not None and "kl_in_reward" in state:
            self.kl_reward.load_state_dict(state["kl_in_reward"])
        if "objective" in state:  # written before the loss was a sum of terms
            restore_pre_terms_state(state["objective"], self.objective, self.kl_reward)

    # ------------------------------------------------------------------ stages wired

    def open_rollouts(self) -> tuple[BatchSource | None, WeightSink | None]:
        """The batch source and sink; with the Ray workers, says whether the update streams, and warns when
        stale samples would go uncorrected (this method's loss is the one that reads algo.correction)."""
        source, sink = super().open_rollouts()
        if source is not None and source.streams:
            why = stream_blocker(self.cfg, self.sampler)
            self.report.note("pipeline: the learner forwards groups as they arrive (pipeline.stream)" if why is None
                             else f"pipeline: the learner waits for each whole batch: {why}")
            if (note := staleness_warning(self.cfg)) is not None:
                self.report.warn(note)
        return source, sink

    def stream_for(self, step: int) -> StreamedUpdate | None:
        """The streamed update of this step's batch, when the Ray workers feed it and nothing in the
        method needs the whole batch first (`stream_blocker`)."""
        if not self.source.streams or stream_blocker(self.cfg, self.sampler) is not None:
            return None
        return StreamedUpdate(self.updater, self.objective, lambda piece: self.prepare_piece(piece, step),
                              self.runtime.tokenizer.pad_token_id)

    def collect_batch(self, step: int, stream: StreamedUpdate | None = None) -> tuple[Batch, dict[str, Any]]:
        """Rollout + reward + filter; with filters, draw more prompts until the batch is full
        (at most rollout.max_resample_rounds extra rounds); kept groups go to `stream` as they arrive."""
        got = self.source.next(step, stream)
        if got.seen.rewards is not None:  # per-prompt feedback for curriculum samplers (uniform ignores it)
            extra = {}
            if SAMPLERS.get(self.cfg.data.sampler.name).traits.confidence:  # CoDaPO's resampling value reads it
                from upslope.algos.confidence import sequence_confidence

                extra["confidence"] = sequence_confidence(got.seen)
            self.sampler.update(got.indices, got.seen.rewards, got.seen.group_ids, **extra)
        metrics = got.metrics
        self.warn_reply_cut(metrics.get("agent/env_reply_cut", 0.0))
        metrics["rollout/groups_kept"] = float(got.batch.num_groups) if got.batch.size else 0.0
        if self.filters:
            metrics["filter/groups_dropped"] = float(got.dropped)
        return got.batch, metrics

    def warn_reply_cut(self, share: float) -> None:
        """Once a run: trajectories ended because an environment reply (a tool result, guidance) did not fit the
        token budget, so the mechanism that reply carries never reached the policy."""
        if share > 0 and not self.warned_reply_cut:
            self.warned_reply_cut = True
            self.report.warn(f"{share:.0%} of a step's trajectories ended because an environment reply (a tool result "
                             f"or guidance) did not fit rollout.max_new_tokens={self.cfg.rollout.max_new_tokens}; "
                             "raise it (metric agent/env_reply_cut)")

    def prepare(self, batch: Batch, metrics: dict[str, Any], step: int = 0) -> Batch:
        """Between reward and update: overlong masking, reference log-probs (and KL folded
        into the reward), critic values and returns, advantages, then replayed rows (algo.replay)."""
        algo = self.cfg.algo
        if algo.mask_truncated:
            batch = stages.mask_truncated(batch)
        if self.uses_reference:
            batch, kl = with_reference(batch, self.updater, self.objective.temperature, self.kl_reward,
                                       self.objective.forward.truncation)
            if kl is not None:
                metrics["kl"] = kl
        if self.critic is not None:
            batch = replace(batch, values=self.critic.values(batch))
        batch = stages.advantage(batch, self.with_salience(batch, metrics))
        metrics.update(advantage_metrics(batch))
        if self.replay is not None:
            batch, replayed = self.replay.mix(batch, step, self.runtime.tokenizer.pad_token_id)
            metrics.update(replayed)
        return batch

    def prepare_piece(self, piece: Batch, step: int) -> Prepared:
        """`prepare` of a streamed piece (whole groups) and what it measured there."""
        measured: dict[str, Any] = {}
        return self.prepare(piece, measured, step), measured

    def with_salience(self, batch: Batch, metrics: dict[str, Any]) -> Any:
        """The advantage estimator, given the policy's per-token salience when it declares a
        `salience` source (FlowTracer, ARCA, GRAIL: one extra pass, its seconds in the metrics), or each
        rollout's feature vector when it declares a `features` source (GEOALIGN: one forward)."""
        import time

        if self.features_source:
            from upslope.train.learner.salience import FEATURES, rollout_features

            t0 = time.perf_counter()
            source = FEATURES[self.features_source]
            features = rollout_features(self.updater, batch, source, **shared_options(self.advantage_fn, source))
            metrics["features/seconds"] = time.perf_counter() - t0
            return functools.partial(self.advantage_fn, features=features)
        source = self.salience_source
        if not source:
            return self.advantage_fn
        from upslope.train.learner.salience import token_salience

        t0 = time.perf_counter()
        # the bound advantage's answer region (a salience advantage has the option: checked when it registers)
        answer = int(bound_options(self.advantage_fn)["answer_tokens"])
        salience = token_salience(self.updater, batch, source, answer)
        metrics["salience/seconds"] = time.perf_counter() - t0
        return functools.partial(self.advantage_fn, salience=salience)

    def check_mismatch(self, step: int, mismatch: float | None) -> None:
        """One warning line at the run's first two steps when the sampler and the learner disagree beyond
        rounding (guards.mismatch_warning); runs whose samples may be stale (pipeline.max_staleness > 0)
        are skipped, their gap is partly the staleness."""
        if self.cfg.pipeline.max_staleness > 0:
            return
        note = mismatch_warning(step, self.start_step, mismatch, self.cfg.train.precision, self.cfg.engine.dtype)
        if note:
            self.report.warn(note)

    def check_update(self, batch: Batch, saved: dict[str, Any]) -> dict[str, Any]:
        """algo.accept: judge the updated policy on the batch (one extra forward) and undo the update it vetoes."""
        assert self.accept is not None
        accepted, metrics = self.accept(batch, self.updater.logprobs(batch, temperature=self.objective.temperature,
                                                                     truncation=self.objective.forward.truncation))
        if not accepted:
            self.updater.restore(saved)
        return metrics

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        stream = self.stream_for(step)
        batch, metrics = self.collect_batch(step, stream)
        if stream is not None:
            metrics["pipeline/streamed_groups"] = float(sum(p.num_groups for p, _ in stream.done))
        if batch.size == 0:
            metrics["skipped"] = 1.0  # every group was filtered out: nothing to learn from this step
            return metrics
        with self.clock("learner"):
            if stream is not None and stream.started:  # some groups were forwarded while the rest arrived
                saved = self.updater.snapshot() if self.accept else None  # the weights have not moved yet
                batch, update_metrics, parts = stream.finish()
                metrics.update(combine_piece_metrics(parts))
                metrics.update(advantage_metrics(batch))
            else:  # the whole-batch update (bit for bit the synchronous loop's)
                batch = self.prepare(batch, metrics, step)
                saved = self.updater.snapshot() if self.accept else None
                update_metrics = self.updater.update(batch, step, self.objective)
            metrics.update(update_metrics)
            self.check_mismatch(step, metrics.get("mismatch"))
            if saved is not None:
                metrics.update(self.check_update(batch, saved))
            if self.critic is not None:
                metrics.update(self.critic.train_step(batch))
            if self.kl_reward is not None:
                metrics.update(self.kl_reward.after_update(metrics.get("kl", 0.0), batch.size))
            metrics.update(self.objective.after_update(metrics, batch.size))
        with self.clock("sync"):
            self.sink.push(self.updater.named_weights(), step)
        return metrics
