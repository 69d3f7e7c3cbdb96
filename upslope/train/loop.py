"""The loop every trainer shares (BaseTrainer): set up, then step -> log -> evaluate ->
checkpoint, with exact resume. The stages are functions in `upslope.train.stages` and
`upslope.train.collect`, the update is `Updater.update` with the method's objective; the
trainers in `upslope.train.trainers` wire them together."""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from upslope import checkpoint as ckpt
from upslope.batch import Batch
from upslope.config import Config, dump
from upslope.data import is_single_file, load_examples
from upslope.data.prompts import check_reply_fits, encode_prompts
from upslope.data.types import Example
from upslope.data.samplers import make_sampler, sampler_examples
from upslope.errors import ConfigError
from upslope.distributed import group
from upslope.eval.runner import eval_data_config, evaluate
from upslope.logs.plot import plot_run
from upslope.logs.progress import Report, step_display
from upslope.logs.sinks import MetricsLogger, read_metrics
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns, check_answers
from upslope.rollout.base import SamplingParams
from upslope.runtime import Runtime
from upslope.rollout.plugin import make_rollout, rollout_fn
from upslope.train.collect import Collected, Task, collect
from upslope.train.learner.memory import release_freed_memory
from upslope.train.learner.updater import SHARDED_STATE, Updater, default_device
from upslope.train.timing import StageClock, gpu_peak_gib, throughput

if TYPE_CHECKING:
    from upslope.train.learner.stream import StreamedUpdate


def step_seed(seed: int, step: int) -> int:
    """The seed of (run seed, step), without seeding anything (prefetched rollouts use it ahead of time)."""
    return (seed * 1_000_003 + step * 7_919) % (2**31)


def seed_step(seed: int, step: int) -> int:
    """Seed every RNG from (seed, step), so a resumed run repeats the same randomness."""
    s = step_seed(seed, step)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    return s


class BaseTrainer:
    """The loop every trainer shares: set up, then step -> log -> evaluate -> checkpoint, with
    exact resume. A method subclasses it and supplies `setup()` (its data, rewards, ...),
    `setup_objective()` (what the update optimises) and `step(step) -> metrics`; everything it keeps in `self.sampler` (anything with
    state_dict/load_state_dict) and `extra_state()` is checkpointed and resumed."""

    uses_engine = True  # start the rollout engine before step 1 (else lazily, e.g. for evaluation)

    def __init__(self, cfg: Config):
        group.init_from_env(cfg.dist.backend, default_device())  # a learner rank (torchrun or `spawn`)
        self.main = group.is_main()  # rank 0 owns the engine, data order, rewards, logs and checkpoints
        if not self.main:
            cfg = cfg.model_copy(update={"log": cfg.log.model_copy(update=dict.fromkeys(
                ("jsonl", "tensorboard", "progress", "plot"), False))})
        self.cfg = cfg
        self.report = Report(enabled=self.main)
        self.check_config()
        self.rollout = rollout_fn(cfg.rollout.kind)  # an unknown rollout.kind fails before the model loads
        t = cfg.train
        torch.set_num_threads(t.threads or max((os.cpu_count() or 1) // group.world(), 1))
        torch.use_deterministic_algorithms(t.deterministic, warn_only=True)
        seed_step(t.seed, 0)
        self.run_dir = Path(cfg.run_dir)
        self.runtime = Runtime.create(cfg, announce=self.report.note)
        self.rollout = make_rollout(cfg, self.runtime.tokenizer)
        self.clock = StageClock()
        self.eval_examples = load_examples(eval_data_config(cfg), "test")
        self.sampler: Any = None
        self.device = default_device()
        self.setup()  # before loading the policy, so that a bad plugin name fails fast
        self.updater = self.make_updater()
        self.setup_objective()
        self.start_step = 0
        if t.resume:  # before the engine starts: a bad checkpoint is reported at once
            self._resume(ckpt.find_checkpoint(self.run_dir, t.resume))
        self.current_step = self.start_step  # the weights version the learner is at
        self.pipe = self.start_pipe()
        if self.uses_engine and self.main and self.pipe is None:
            self.runtime.engine  # start the engine now, so no step's timing includes its start-up
        self.logger = MetricsLogger(self.run_dir, cfg.log, resume_step=self.start_step if t.resume else None)

    def start_pipe(self) -> Any:
        """With dist.rollout_workers > 0 (rank 0 of a method that samples a task): the Ray rollout
        workers and the asynchronous pipeline feeding `collect`; else None (the in-process engine)."""
        if not (self.cfg.dist.rollout_workers and self.uses_engine and self.main and hasattr(self, "task")):
            return None
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError(f"dist.rollout_workers={self.cfg.dist.rollout_workers}: ray is not installed "
                              f"(pip install 'upslope[ray]')")
        if group.world() > 1:
            raise ConfigError("dist.rollout_workers > 0 with several learner ranks is not supported yet; "
                              "set dist.learner_procs=1")
        from upslope.train.async_pipe import RolloutPipe

        pipe = RolloutPipe(self.cfg, self.task, self.runtime.tokenizer.pad_token_id, self.start_step,
                           warn=self.report.warn)
        pipe.restore(getattr(self, "_pipe_pending", {}), lambda s: self.sampling_params(s, 0))
        return pipe

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
        examples = load_examples(cfg.data, "train")
        examples += sampler_examples(cfg.data, examples)  # prompts a sampler adds (TD-Grokking's subproblems)
        self.prompt_ids, self.examples = self.encode_prompts(examples, cfg.rollout.max_new_tokens)
        check_reply_fits(self.runtime.tokenizer, cfg.eval.max_new_tokens, "eval.max_new_tokens")  # before any work
        self.sampler = make_sampler(cfg.data, len(self.examples), cfg.train.seed, self.examples)
        # the Ray rollout workers (dist.rollout_workers) hold the current weights; the local engine does not
        self.reward_context = self.runtime.reward_context(engine=not cfg.dist.rollout_workers)
        self.reward_fns = build_reward_fns(cfg.reward, cfg.data, self.reward_context) if rewards else []
        check_answers(self.reward_fns, self.examples)
        self.combiner = REWARD_COMBINERS.bind(cfg.algo.reward_combiner.name, cfg.algo.reward_combiner.options,
                                              where="algo.reward_combiner.options")
        self.task = Task(self.prompt_ids, self.examples, self.reward_fns, self.combiner, cfg.reward_fallback,
                         self.runtime.tokenizer)

    def collect(self, step: int, *, want: int, per_round: int | None = None, refill: bool = True,
                max_rounds: int = 0, keep: Callable[[Batch], Batch] | None = None,
                stream: StreamedUpdate | None = None) -> Collected:
        """The collect stage over this method's task (see `upslope.train.collect.collect`),
        drawing from `self.sampler`, seeded by the step and round, timed on the step's clock. With
        several learner ranks rank 0 collects and every rank gets the batch. With the Ray workers and
        a `stream`, kept groups go to it as they arrive and it works while the learner waits."""
        if not self.main:
            return group.broadcast(None)
        if self.pipe is not None:
            return self.collect_from_pipe(step, want=want, per_round=per_round or want, refill=refill,
                                          max_rounds=max_rounds, keep=keep, stream=stream)
        got = collect(self.runtime.engine, self.task, self.sampler.next, lambda round_: self.sampling(step, round_),
                      self.runtime.tokenizer.pad_token_id, want=want, per_round=per_round or want, refill=refill,
                      max_rounds=max_rounds, keep=keep, rollout=self.rollout, clock=self.clock,
                      merge_repeats=self.merge_repeats)
        engine = self.runtime.engine
        got.metrics["rollout/engine_on_gpu"] = float(engine.device.startswith("cuda"))
        engine.sleep()  # a GPU-colocated engine frees its memory for the learner until the next sync
        return group.broadcast(got)

    @property
    def merge_repeats(self) -> bool:
        """Does the sampler give a prompt several draws of n rollouts as one group (its optional
        `merge_repeats` attribute; CERO's variable rollouts per prompt)?"""
        return bool(getattr(self.sampler, "merge_repeats", False))

    def collect_from_pipe(self, step: int, *, want: int, per_round: int, refill: bool, max_rounds: int,
                          keep: Callable[[Batch], Batch] | None, stream: StreamedUpdate | None = None) -> Collected:
        """The collect stage with the groups from the Ray rollout workers (dist.rollout_workers): this
        step's admitted ahead, later steps admitted as far as pipeline.max_staleness allows. With a
        `stream`, each job's kept groups go to it on arrival, and while no job is ready the learner
        forwards what has arrived (timed as learner, not as rollout)."""
        from upslope.train.async_pipe import StepFeed

        pipe = self.pipe
        pipe.prefetch(min(self.cfg.train.steps, pipe.version + 1 + self.cfg.pipeline.max_staleness),
                      self.sampler.next, per_round, lambda s: self.sampling_params(s, 0))

        def idle() -> bool:
            if stream is None or not stream.pending:
                return False
            with self.clock("learner", pause="rollout"):
                return stream.work()

        feed = StepFeed(pipe, step, self.sampler.next, self.sampling_params, idle=idle)
        got = collect(None, self.task, feed.draw, lambda round_: self.sampling(step, round_),  # type: ignore[arg-type]
                      self.runtime.tokenizer.pad_token_id, want=want, per_round=per_round, refill=refill,
                      max_rounds=max_rounds, keep=keep, rollout=feed.rollout, clock=self.clock,
                      merge_repeats=self.merge_repeats, pieces=feed.pieces if stream is not None else None,
                      on_kept=stream.add if stream is not None else None)
        got.metrics["pipeline/max_lag"] = float(feed.max_lag)
        got.metrics["rollout/engine_on_gpu"] = float(feed.on_gpu)  # the workers' engines
        return got

    def sampling(self, step: int, round_: int = 0, n: int | None = None) -> SamplingParams:
        """The step's sampling parameters; (re)seeds every RNG from the step, as the synchronous loop always has."""
        seed_step(self.cfg.train.seed, step)
        return self.sampling_params(step, round_, n)

    def sampling_params(self, step: int, round_: int = 0, n: int | None = None) -> SamplingParams:
        """The sampling parameters of (step, round) without touching any RNG (for groups generated ahead)."""
        r = self.cfg.rollout
        return SamplingParams(n=n or r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=r.max_new_tokens, seed=step_seed(self.cfg.train.seed, step) + round_,
                              stop_token_ids=self.runtime.stop_ids)

    def sync_weights(self) -> None:
        """Push the learner's weights into the rollout engine (starting it if needed), then hand
        the update's freed memory back to the OS. The other learner ranks take part in gathering
        the weights from their shards."""
        if not self.main:
            for _ in self.updater.named_weights():
                pass
            return
        if self.pipe is not None:  # the Ray workers; the in-process engine (evaluation) is synced when it evaluates
            self.pipe_push_s = self.pipe.push(self.updater.named_weights(), self.current_step)
            self.pipe.prefetch(min(self.cfg.train.steps, self.current_step + 1 + self.cfg.pipeline.max_staleness),
                               self.sampler.next, self.cfg.rollout.prompts_per_step,
                               lambda s: self.sampling_params(s, 0))
            release_freed_memory()
            return
        self.runtime.engine.update_weights(self.updater.named_weights())
        release_freed_memory(self.updater.device)

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        if cfg.eval.data is None and is_single_file(cfg.data):  # warned here, after every check
            self.report.warn(f"evaluation reads the training file {cfg.data.path} (one file has no held-out "
                             f"split): its accuracy is on training prompts; set eval.data.path for a held-out set")
        if self.start_step and self.uses_engine:
            self.sync_weights()
        results: dict[str, Any] = {}
        if t.eval_before and self.start_step == 0:
            results["before"] = self.evaluate(0)
        last = min(t.steps, self.start_step + t.stop_after) if t.stop_after else t.steps
        with step_display(t.steps, self.start_step, enabled=cfg.log.progress) as display:
            for step in range(self.start_step + 1, last + 1):
                metrics = self.timed_step(step)
                self.logger.log(step, metrics)
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

    def timed_step(self, step: int) -> dict[str, Any]:
        """One `step` on a fresh clock: its metrics plus each stage's time and tokens per second."""
        self.clock = StageClock()
        self.current_step = step
        self.pipe_push_s = 0.0
        with self.clock("step"):
            metrics = self.step(step)
        metrics.update(self.clock.metrics())
        metrics.update(throughput(metrics))
        metrics.update(gpu_peak_gib(self.device))
        if self.pipe is not None:
            seconds = self.clock.seconds["step"]
            metrics.update(self.pipe.step_metrics(seconds))
            metrics["pipeline/weight_push_s"] = self.pipe_push_s
            metrics["pipeline/learner_busy"] = self.clock.seconds.get("learner", 0.0) / max(seconds, 1e-9)
            self.pipe.events.extend({"who": "learner" if stage != "rollout" else "learner_wait", "start": t0,
                                     "end": t1, "step": step} for stage, t0, t1 in self.clock.spans
                                    if stage in ("learner", "sync", "rollout"))
        return metrics

    def evaluate(self, step: int) -> dict[str, Any]:
        if not self.uses_engine and step > 0:  # the engine has not been following the learner's updates
            self.sync_weights()
        elif self.pipe is not None and step > 0:  # the Ray workers followed the updates; the local engine did not
            self.runtime.engine.update_weights(self.updater.named_weights())
        if not self.main:
            return {}
        summary = evaluate(self.runtime, self.eval_examples, out_dir=self.run_dir / "eval", tag=f"step{step}",
                           show_progress=self.cfg.log.progress)
        self.logger.log(step, {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        self.report.result(f"eval @ step {step}: accuracy {summary['accuracy']:.3f} "
                           f"({summary['prompts']} prompts, {summary['tokens_per_s']:.0f} tok/s)")
        return summary

    def save(self, step: int) -> Path:
        state = {"step": step, **self.updater.state(), "rng": ckpt.rng_state(),
                 "sampler": self.sampler.state_dict() if self.sampler is not None else None,
                 "engine_version": self.runtime.engine_version}
        if self.pipe is not None:  # steps drawn ahead: regenerated with these weights on resume
            state["pipeline"] = self.pipe.pending()
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

    def _resume(self, path: Path) -> None:
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
        self._pipe_pending = state.get("pipeline") or {}
        ckpt.set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self.report.info(f"resumed from {path} at step {self.start_step}")

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
        if self.pipe is not None:
            import json

            with open(self.run_dir / "timeline.jsonl", "w") as f:  # who was busy when (benchmarks/async_timeline.py)
                f.writelines(json.dumps(e) + "\n" for e in self.pipe.events)
            self.pipe.close()
            self.pipe = None
        self.runtime.close()
