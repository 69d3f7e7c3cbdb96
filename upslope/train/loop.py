"""The loop every trainer shares (BaseTrainer): set up, then step -> log -> evaluate ->
checkpoint, with exact resume. A method's step reads its batch from a batch source, prepares it,
updates the learner with its objective and pushes the weights to a sink (`upslope.train.sources`);
the trainers in `upslope.train.trainers` wire those parts together."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from upslope import checkpoint as ckpt
from upslope.config import Config, dump
from upslope.data import is_single_file, load_examples, overlap
from upslope.data.prompts import check_reply_fits, encode_prompts
from upslope.data.samplers import make_sampler, sampler_examples
from upslope.data.types import Example
from upslope.distributed import group
from upslope.eval.runner import evaluate, load_eval_examples
from upslope.logs.plot import plot_run
from upslope.logs.progress import Report, step_display
from upslope.logs.sinks import MetricsLogger, read_metrics, sample_rows, tracker_plugins
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns, check_rewards
from upslope.rewards.context import RewardContext
from upslope.rollout.plugin import make_rollout, rollout_fn
from upslope.runtime import Runtime
from upslope.seeding import seed_step
from upslope.train.collect import Keep, Rounds, Task
from upslope.train.learner.updater import SHARDED_STATE, Updater, default_device
from upslope.train.sources import BatchSource, EngineSink, LocalCollector, WeightSink
from upslope.train.timing import StageClock, gpu_peak_gib, throughput


class BaseTrainer:
    """The loop every trainer shares: set up, then step -> log -> evaluate -> checkpoint, with
    exact resume. A method subclasses it and supplies `setup()` (its data, rewards, ...; a method
    that samples sets `self.rounds` and `self.keep` for its batch source), `setup_objective()` (what
    the update optimises) and `step(step) -> metrics`; everything it keeps in `self.sampler`
    (anything with state_dict/load_state_dict) and `extra_state()` is checkpointed and resumed."""

    uses_engine = True  # start the rollout engine before step 1 (else lazily, e.g. for evaluation)
    pushes_weights = True  # does the rollout engine follow the trained model? (a reward model's does not)

    def __init__(self, cfg: Config):
        group.init_from_env(cfg.dist.backend, default_device())  # a learner rank (torchrun or `spawn`)
        self.main = group.is_main()  # rank 0 owns the engine, data order, rewards, logs and checkpoints
        if not self.main:
            cfg = cfg.model_copy(update={"log": cfg.log.model_copy(update={**dict.fromkeys(
                ("jsonl", "tensorboard", "progress", "plot"), False), "trackers": []})})
        self.cfg = cfg
        self.report = Report(enabled=self.main)
        self.check_config()
        tracker_plugins(cfg.log)  # a tracker that is not installed fails before the model loads
        rollout_fn(cfg.rollout.kind)  # an unknown rollout.kind fails before the model loads
        t = cfg.train
        torch.set_num_threads(t.threads or max((os.cpu_count() or 1) // group.world(), 1))
        torch.use_deterministic_algorithms(t.deterministic, warn_only=True)
        seed_step(t.seed, 0)
        self.run_dir = Path(cfg.run_dir)
        self.runtime = Runtime.create(cfg, announce=self.report.note)
        self.rollout = make_rollout(cfg, self.runtime.tokenizer)
        self.clock = StageClock()
        self.eval_examples = load_eval_examples(cfg)
        self.sampler: Any = None
        self.task: Task | None = None
        self.reward_context: RewardContext | None = None  # what the training rewards may use (setup_task)
        self.rounds: Rounds | None = None  # how a step collects its batch (None: it does not sample)
        self.keep: Keep | None = None  # which collected groups it keeps (None: all)
        self.device = default_device()
        self.setup()  # before loading the policy, so that a bad plugin name fails fast
        held_out = self.eval_examples[: cfg.eval.limit] if cfg.eval.limit else self.eval_examples
        shared = overlap([e for e in getattr(self, "examples", []) if isinstance(e, Example)], held_out)
        self.eval_overlap = (shared, len(held_out)) if shared else None  # logged beside every evaluation
        self.overlap_to_say: tuple[int, int] | None = None  # ... and said once, beside the first result
        self.updater = self.make_updater()
        self.setup_objective()
        self.start_step = 0
        resumed: dict[str, Any] = {}
        if t.resume:  # before the engine starts: a bad checkpoint is reported at once
            resumed = self._resume(ckpt.find_checkpoint(self.run_dir, t.resume))
        self.current_step = self.start_step  # the weights version the learner is at
        self.source, self.sink = self.open_rollouts()
        if self.source is not None:
            self.source.load_state_dict(resumed)
        # evaluation samples from the in-process engine: it is pushed the weights unless it follows them already
        self.eval_sink = None if isinstance(self.sink, EngineSink) else EngineSink(self.runtime, self.device)
        if self.source is not None:
            self.source.start()  # now, so no step's timing includes its start-up
        elif self.uses_engine and self.main:
            self.runtime.engine
        self.logger = MetricsLogger(self.run_dir, cfg.log, resume_step=self.start_step if t.resume else None,
                                    config=cfg.model_dump(mode="json"), announce=self.report.note)

    def open_rollouts(self) -> tuple[BatchSource | None, WeightSink | None]:
        """The batch source of a method that samples (`self.rounds` set) and the sink its weights go to:
        the Ray pipeline (both) with dist.rollout_workers > 0, else the local collector and the
        in-process engine."""
        source: BatchSource | None = None
        sink: WeightSink | None = EngineSink(self.runtime, self.device) if self.uses_engine else None
        if self.rounds is not None and self.uses_engine and self.task is not None:
            if self.cfg.dist.rollout_workers:
                from upslope.train.pipeline import RayPipeline, check_pipeline

                check_pipeline(self.cfg)
                source = sink = RayPipeline(self.cfg, self.task, self.sampler, self.rounds, self.keep,
                                            self.runtime.stop_ids, self.clock, self.run_dir, self.start_step,
                                            self.report.warn)
            else:
                source = LocalCollector(self.cfg, self.runtime, self.task, self.sampler, self.rounds, self.keep,
                                        self.rollout, self.clock)
        return source, sink if self.pushes_weights else None

    def check_config(self) -> None:
        """Reject option combinations the method cannot run (one ConfigError line)."""

    def setup(self) -> None:
        """The method's own parts: data, rewards, sampler, extra models (runs before the policy
        is loaded; `self.device` is where the learner will be)."""

    def make_updater(self) -> Updater:
        """The learner: the policy (a causal LM) on the run's optimiser; a method that trains
        another model (e.g. a reward model) builds its own."""
        return Updater.from_config(self.cfg, self.runtime.model_path, self.device)

    def setup_objective(self) -> None:
        """What the method optimises, built once the policy is loaded (e.g. an Objective that needs
        the frozen reference)."""

    def step(self, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        """Method state saved in checkpoints besides weights, optimiser, RNG and sampler."""
        return {}

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        """Restore what `extra_state` saved."""

    def save_extra_shards(self, shards: Path) -> None:
        """Across learner ranks: the DCP shards of any other trained model (PPO's critic) under
        `shards`, the checkpoint's sharded/ directory (every rank calls it)."""

    def encode_prompts(self, examples: list[Example],
                       max_new_tokens: int | None = None) -> tuple[list[list[int]], list[Example]]:
        """Prompt token ids through the chat template; long prompts (with the `max_new_tokens` they
        will be sampled with, if any, beyond the model's context) are an error or dropped."""
        cfg = self.cfg
        ids, kept = encode_prompts(examples, self.runtime.tokenizer, system_prompt=cfg.data.system_prompt,
                                   use_chat_template=cfg.model.use_chat_template,
                                   max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                                   drop_long=cfg.rollout.drop_long_prompts, max_new_tokens=max_new_tokens)
        if len(kept) < len(examples):
            self.report.warn(f"dropped {len(examples) - len(kept)} prompts over rollout.max_prompt_tokens")
        return ids, [examples[i] for i in kept]

    def setup_task(self, rewards: bool = True) -> None:
        """The training prompts of `data` (encoded, with a seeded checkpointed sampler) and,
        with `rewards`, the reward functions and their combiner: what every method that samples
        from the policy needs."""
        cfg = self.cfg
        examples = load_examples(cfg.data, "train", announce=self.report.note)
        examples += sampler_examples(cfg.data, examples)  # prompts a sampler adds (TD-Grokking's subproblems)
        self.prompt_ids, self.examples = self.encode_prompts(examples, cfg.rollout.max_new_tokens)
        check_reply_fits(self.runtime.tokenizer, cfg.eval.max_new_tokens, "eval.max_new_tokens")  # before any work
        self.sampler = make_sampler(cfg.data, len(self.examples), cfg.train.seed, self.examples)
        # the Ray rollout workers (dist.rollout_workers) hold the current weights; the local engine does not
        self.reward_context = self.runtime.reward_context(engine=not cfg.dist.rollout_workers)
        self.reward_context.total_steps = cfg.train.steps
        self.reward_fns = build_reward_fns(cfg.reward, cfg.data, self.reward_context) if rewards else []
        for rf in self.reward_fns:
            if rf.note:
                self.report.note(rf.note)
        check_rewards(self.reward_fns, self.examples)
        self.combiner = REWARD_COMBINERS.bind(cfg.algo.reward_combiner.name, cfg.algo.reward_combiner.options,
                                              where="algo.reward_combiner.options")
        tok = self.runtime.tokenizer
        self.task = Task(self.prompt_ids, self.examples, self.reward_fns, self.combiner, cfg.reward_fallback, tok,
                         tok.pad_token_id)

    @property
    def merge_repeats(self) -> bool:
        """Does the sampler give a prompt several draws of n rollouts as one group (its `merge_repeats`;
        CERO's variable rollouts per prompt)?"""
        return bool(self.sampler.merge_repeats)

    def push_weights(self) -> None:
        """The learner's weights to the sink (the engine or the Ray workers), if the method has one."""
        if self.sink is not None:
            self.sink.push(self.updater.named_weights(), self.current_step)

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        if cfg.eval.data is None and is_single_file(cfg.data):  # warned here, after every check
            self.report.warn(f"evaluation reads the training file {cfg.data.path} (one file has no held-out "
                             f"split): its accuracy is on training prompts; set eval.data.path for a held-out set")
        else:
            self.overlap_to_say = self.eval_overlap  # said beside the first evaluation's result
        if self.start_step:
            self.push_weights()
        results: dict[str, Any] = {}
        if t.eval_before and self.start_step == 0:
            results["before"] = self.evaluate(0)
        last = min(t.steps, self.start_step + t.stop_after) if t.stop_after else t.steps
        with step_display(t.steps, self.start_step, enabled=cfg.log.progress) as display:
            for step in range(self.start_step + 1, last + 1):
                metrics = self.timed_step(step)
                self.logger.log(step, metrics)
                self.log_table(step)
                if self.main:
                    display.update(step, metrics)
                if ((t.eval_every and step % t.eval_every == 0) or step in t.eval_at) and step != t.steps:
                    self.evaluate(step)
                if (t.save_every and step % t.save_every == 0) or step == last:
                    self.save(step)
        if last < t.steps:
            self.report.info(f"stopped after step {last} (train.stop_after); resume with train.resume=latest")
        elif t.eval_after:
            results["after"] = self.evaluate(t.steps)
        self.logger.close()
        self.finish(results)
        return results

    def log_table(self, step: int) -> None:
        """Every log.table_every steps (and at the first), the step's first sampled completions with their
        rewards, to rollouts.jsonl and the trackers."""
        every = self.cfg.log.table_every
        samples = self.source.last_seen if self.source is not None else None
        if self.main and every and samples is not None and samples.size and (step % every == 0 or step == 1):
            self.logger.table(step, sample_rows(samples, step, self.cfg.log.table_rows))

    def timed_step(self, step: int) -> dict[str, Any]:
        """One `step` on a fresh clock: its metrics plus each stage's time and tokens per second."""
        self.clock.reset()
        self.current_step = step
        if self.reward_context is not None:  # the step the rewards are told about (a schedule may read it)
            self.reward_context.step = step
        with self.clock("step"):
            metrics = self.step(step)
        metrics.update(self.clock.metrics())
        metrics.update(throughput(metrics))
        metrics.update(gpu_peak_gib(self.device))
        if self.source is not None:
            metrics.update(self.source.step_metrics(self.clock, step))
        return metrics

    def evaluate(self, step: int) -> dict[str, Any]:
        if step > 0 and self.eval_sink is not None:  # the engine that evaluates has not followed the updates
            self.eval_sink.push(self.updater.named_weights(), step)
        if not self.main:
            return {}
        summary = evaluate(self.runtime, self.eval_examples, out_dir=self.run_dir / "eval", tag=f"step{step}",
                           show_progress=self.cfg.log.progress)
        metrics = {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
        if self.eval_overlap:  # the share of the held-out prompts that are training prompts, beside the accuracy
            metrics["eval/train_overlap"] = self.eval_overlap[0] / self.eval_overlap[1]
        self.logger.log(step, metrics)
        self.report.result(f"eval @ step {step}: accuracy {summary['accuracy']:.3f} "
                           f"({summary['prompts']} prompts, {summary['tokens_per_s']:.0f} tok/s)")
        if self.overlap_to_say:
            n, total = self.overlap_to_say
            share = f"all {total}" if n == total else f"{n} of {total}"
            self.report.warn(f"evaluation: {share} held-out prompts are also training prompts (same prompt and "
                             f"answer), so the held-out accuracy is {'' if n == total else 'partly '}measured on "
                             f"training data; set eval.data to a disjoint set")
            self.overlap_to_say = None
        return summary

    def save(self, step: int) -> Path:
        state = {"step": step, **self.updater.state(), "rng": ckpt.rng_state(),
                 "sampler": self.sampler.state_dict() if self.sampler is not None else None,
                 "engine_version": self.runtime.engine_version}
        if self.source is not None:  # e.g. the steps the Ray pipeline drew ahead
            state.update(self.source.state_dict())
        state.update(self.extra_state())
        ckpt_dir = self.run_dir / "checkpoints"
        if group.world() == 1:
            return ckpt.save_checkpoint(ckpt_dir, step, self.updater.model, self.runtime.tokenizer,
                                        state, dump(self.cfg), self.cfg.train.keep_last)
        staged = ckpt_dir / f".sharded-step_{step:06d}"  # every rank writes its shards, rank 0 moves them in
        self.updater.save_sharded(staged)
        self.save_extra_shards(staged)
        weights = self.updater.export_weights()  # gathered on rank 0 for the HF-format model/
        final = ckpt_dir / f"step_{step:06d}"
        if self.main:
            final = ckpt.save_checkpoint(ckpt_dir, step, self.updater.model, self.runtime.tokenizer, state,
                                         dump(self.cfg), self.cfg.train.keep_last, weights=weights, sharded=staged)
        group.barrier()
        return final

    def _resume(self, path: Path) -> dict[str, Any]:
        """Restore the learner, sampler, method state and RNGs from the checkpoint at `path`; the state read."""
        state = ckpt.load_trainer_state(path)
        ckpt.check_resume(path, int(state["step"]), self.cfg.train.steps, final_eval=self.cfg.train.eval_after)
        if (path / ckpt.SHARDED).is_dir():  # weights and optimiser state as DCP shards, for any number of ranks
            self.updater.load_sharded(path / ckpt.SHARDED)
        elif group.world() > 1:  # a one-process checkpoint: every rank reads it whole and keeps its shards
            self.updater.load_full(ckpt.read_trained_weights(path, self.cfg.lora.enabled), state["optimizer"])
            state = {**state, "optimizer": SHARDED_STATE}
        else:
            ckpt.load_model_weights(self.updater.model, path)
        self.updater.load_state(state)
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.load_extra_state(state, path)
        ckpt.set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.report.info(f"resumed from {path} at step {self.start_step}")
        return state

    def finish(self, results: dict[str, Any]) -> None:
        records = read_metrics(self.logger.path) if self.logger.jsonl else []
        png = plot_run(records, self.run_dir / "reward.png", title=f"{self.title()} on "
                       f"{self.cfg.data.path or self.cfg.data.task}") if self.cfg.log.plot and records else None
        if "before" in results or "after" in results:
            before = results.get("before", {}).get("accuracy")
            after = results.get("after", {}).get("accuracy")
            fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            self.report.result(f"held-out accuracy: before {fmt(before)} -> after {fmt(after)}")
        self.report.note(f"run directory: {self.run_dir}" + (f"; plot: {png}" if png else ""))

    def title(self) -> str:
        """What the run is, for plot titles."""
        return self.cfg.algo.advantage.name

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
            self.source = None
        if getattr(self, "logger", None) is not None:  # a run that stopped early still finishes its tracker runs
            self.logger.close()
        self.runtime.close()
