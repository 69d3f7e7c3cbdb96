"""The training loop: sample -> rollout -> reward -> filter -> advantage -> update -> sync.

Each stage is a function in `upslope.train.stages` or a method of the Learner; this file
only wires them together, times them, logs, evaluates and checkpoints.
"""
from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from upslope import checkpoint as ckpt
from upslope.batch import Batch
from upslope.config import Config, dump
from upslope.data import load_examples
from upslope.data.prompts import encode_prompts
from upslope.data.types import Example
from upslope.data.samplers import UniformSampler
from upslope.errors import ConfigError, UpslopeError
from upslope.eval.runner import eval_data_config, evaluate
from upslope.logs.plot import plot_run
from upslope.logs.progress import Report, step_display
from upslope.logs.sinks import MetricsLogger, read_metrics
from upslope.registry import ADVANTAGES, FILTERS, REWARD_COMBINERS
from upslope.rewards import build_reward_fns
from upslope.rollout.base import SamplingParams
from upslope.runtime import Runtime
from upslope.train import stages
from upslope.train.collect import Collected, Task, collect, rollout_fn
from upslope.train.learner import Learner, default_device
from upslope.train.memory import release_freed_memory
from upslope.train.timing import StageClock, throughput

GROUP_ADVANTAGES = {"grpo", "dr_grpo", "rloo", "gdpo"}


def seed_step(seed: int, step: int) -> int:
    """Seed every RNG from (seed, step), so a resumed run repeats the same randomness."""
    s = (seed * 1_000_003 + step * 7_919) % (2**31)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    return s


def check_config(cfg: Config) -> None:
    if cfg.algo.advantage.name in GROUP_ADVANTAGES and cfg.rollout.n < 2:
        raise ConfigError(f"rollout.n={cfg.rollout.n}: advantage '{cfg.algo.advantage.name}' compares completions "
                          f"within a group, so it needs rollout.n >= 2")
    if cfg.train.updates_per_batch > cfg.rollout.prompts_per_step:
        raise ConfigError(f"train.updates_per_batch={cfg.train.updates_per_batch}: cannot split "
                          f"{cfg.rollout.prompts_per_step} prompt groups into more mini-batches than groups")


class BaseTrainer:
    """The loop every trainer shares: set up, then step -> log -> evaluate -> checkpoint, with
    exact resume. A method subclasses it and supplies `setup()` (its data, rewards, ...) and
    `step(step) -> metrics`; everything it keeps in `self.sampler` (anything with
    state_dict/load_state_dict) and `extra_state()` is checkpointed and resumed."""

    uses_engine = True  # start the rollout engine before step 1 (else lazily, e.g. for evaluation)

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.report = Report()
        self.check_config()
        t = cfg.train
        torch.set_num_threads(t.threads or os.cpu_count() or 1)
        torch.use_deterministic_algorithms(t.deterministic, warn_only=True)
        seed_step(t.seed, 0)
        self.run_dir = Path(cfg.run_dir)
        self.runtime = Runtime.create(cfg, announce=self.report.note)
        self.rollout = rollout_fn(cfg.rollout.kind)
        self.clock = StageClock()
        self.eval_examples = load_examples(eval_data_config(cfg), "test")
        self.sampler: Any = None
        self.device = default_device()
        self.setup()  # before loading the policy, so that a bad plugin name fails fast
        self.learner = Learner(cfg, self.runtime.model_path, self.device)
        if self.uses_engine:
            self.runtime.engine  # start the engine now, so no step's timing includes its start-up
        self.start_step = 0
        if t.resume:
            self._resume(ckpt.find_checkpoint(self.run_dir, t.resume))
        self.logger = MetricsLogger(self.run_dir, cfg.log, resume_step=self.start_step if t.resume else None)

    def check_config(self) -> None:
        """Reject option combinations the method cannot run (one ConfigError line)."""

    def setup(self) -> None:
        """The method's own parts: data, rewards, sampler, extra models (runs before the policy
        is loaded; `self.device` is where the learner will be)."""

    def step(self, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        """Method state saved in checkpoints besides weights, optimiser, RNG and sampler."""
        return {}

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        """Restore what `extra_state` saved."""

    def encode_prompts(self, examples: list[Example]) -> tuple[list[list[int]], list[Example]]:
        """Prompt token ids through the chat template; long prompts are an error or dropped."""
        cfg = self.cfg
        ids, kept = encode_prompts(examples, self.runtime.tokenizer, system_prompt=cfg.data.system_prompt,
                                   use_chat_template=cfg.model.use_chat_template,
                                   max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                                   drop_long=cfg.rollout.drop_long_prompts)
        if len(kept) < len(examples):
            self.report.warn(f"dropped {len(examples) - len(kept)} prompts over rollout.max_prompt_tokens")
        return ids, [examples[i] for i in kept]

    def setup_task(self, rewards: bool = True) -> None:
        """The training prompts of `data` (encoded, with a seeded checkpointed sampler) and,
        with `rewards`, the reward functions and their combiner: what every method that samples
        from the policy needs."""
        cfg = self.cfg
        self.prompt_ids, self.examples = self.encode_prompts(load_examples(cfg.data, "train"))
        self.sampler = UniformSampler(len(self.examples), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.reward_fns = build_reward_fns(cfg.reward, cfg.data) if rewards else []
        self.combiner = REWARD_COMBINERS.bind(cfg.algo.reward_combiner.name, cfg.algo.reward_combiner.options,
                                              where="algo.reward_combiner.options")
        self.task = Task(self.prompt_ids, self.examples, self.reward_fns, self.combiner, cfg.reward_fallback)

    def collect(self, step: int, *, want: int, per_round: int | None = None, refill: bool = True,
                max_rounds: int = 0, keep: Any = None) -> Collected:
        """The collect stage over this method's task (see `upslope.train.collect.collect`),
        drawing from `self.sampler`, seeded by the step and round, timed on the step's clock."""
        return collect(self.runtime.engine, self.task, self.sampler.next, lambda round_: self.sampling(step, round_),
                       self.runtime.tokenizer.pad_token_id, want=want, per_round=per_round or want, refill=refill,
                       max_rounds=max_rounds, keep=keep, rollout=self.rollout, clock=self.clock)

    def sampling(self, step: int, round_: int = 0, n: int | None = None) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(n=n or r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=r.max_new_tokens, seed=seed_step(self.cfg.train.seed, step) + round_,
                              stop_token_ids=self.runtime.stop_ids)

    def sync_weights(self) -> None:
        """Push the learner's weights into the rollout engine (starting it if needed), then hand
        the update's freed memory back to the OS."""
        self.runtime.engine.update_weights(self.learner.named_weights())
        release_freed_memory()

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        if self.start_step and self.uses_engine:
            self.sync_weights()
        results: dict[str, Any] = {}
        if t.eval_before and self.start_step == 0:
            results["before"] = self.evaluate(0)
        last = min(t.steps, self.start_step + t.stop_after) if t.stop_after else t.steps
        with step_display(t.steps, self.start_step, enabled=cfg.log.progress) as display:
            for step in range(self.start_step + 1, last + 1):
                self.clock = StageClock()
                with self.clock("step"):
                    metrics = self.step(step)
                metrics.update(self.clock.metrics())
                metrics.update(throughput(metrics))
                self.logger.log(step, metrics)
                display.update(step, metrics)
                if t.eval_every and step % t.eval_every == 0 and step != t.steps:
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

    def evaluate(self, step: int) -> dict[str, Any]:
        if not self.uses_engine and step > 0:  # the engine has not been following the learner's updates
            self.sync_weights()
        summary = evaluate(self.runtime, self.eval_examples, out_dir=self.run_dir / "eval", tag=f"step{step}",
                           show_progress=self.cfg.log.progress)
        self.logger.log(step, {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        self.report.result(f"eval @ step {step}: accuracy {summary['accuracy']:.3f} "
                           f"({summary['prompts']} prompts, {summary['tokens_per_s']:.0f} tok/s)")
        return summary

    def save(self, step: int) -> Path:
        state = {"step": step, "optimizer": self.learner.optimizer.state_dict(),
                 "scheduler": self.learner.scheduler.state_dict(), "rng": ckpt.rng_state(),
                 "sampler": self.sampler.state_dict() if self.sampler is not None else None,
                 "engine_version": self.runtime.engine_version}
        state.update(self.extra_state())
        return ckpt.save_checkpoint(self.run_dir / "checkpoints", step, self.learner.model, self.runtime.tokenizer,
                                    state, dump(self.cfg), self.cfg.train.keep_last)

    def _resume(self, path: Path) -> None:
        state = ckpt.load_trainer_state(path)
        ckpt.load_model_weights(self.learner.model, path)
        self.learner.optimizer.load_state_dict(state["optimizer"])
        self.learner.scheduler.load_state_dict(state["scheduler"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.load_extra_state(state, path)
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
        self.runtime.close()


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
        self.filters = [FILTERS.bind(f.name, f.options, where=f"algo.filters[{i}].options")
                        for i, f in enumerate(cfg.algo.filters)]
        self.critic = None
        if cfg.algo.advantage.name == "gae":  # PPO: a value model, only when the advantage needs one
            from upslope.train.critic import Critic

            self.critic = Critic(cfg, self.runtime.model_path, self.device)

    def extra_state(self) -> dict[str, Any]:
        return {"critic": self.critic.state()} if self.critic is not None else {}

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        if self.critic is not None:
            if "critic" not in state:
                raise UpslopeError(f"{path}: checkpoint has no critic state, but algo.advantage is gae")
            self.critic.load(state["critic"])

    # ------------------------------------------------------------------ stages wired

    def collect_batch(self, step: int) -> tuple[Batch, dict[str, Any]]:
        """Rollout + reward + filter; with filters, draw more prompts until the batch is full
        (at most rollout.max_resample_rounds extra rounds)."""
        r = self.cfg.rollout
        got = self.collect(step, want=r.prompts_per_step, max_rounds=r.max_resample_rounds if self.filters else 0,
                           keep=lambda b: stages.apply_filters(b, self.filters))
        metrics = got.metrics
        metrics["rollout/groups_kept"] = float(got.batch.num_groups) if got.batch.size else 0.0
        if self.filters:
            metrics["filter/groups_dropped"] = float(got.dropped)
        return got.batch, metrics

    def prepare(self, batch: Batch, metrics: dict[str, Any]) -> Batch:
        """Between reward and update: overlong masking, reference log-probs (and KL folded
        into the reward), critic values and returns, advantages."""
        learner, algo = self.learner, self.cfg.algo
        if algo.mask_truncated:
            batch = stages.mask_truncated(batch)
        if learner.ref is not None:
            batch = replace(batch, ref_logprobs=learner.logprobs(batch, reference=True))
            if algo.kl_in == "reward":
                batch = replace(batch, old_logprobs=learner.logprobs(batch))
                batch, metrics["kl"] = stages.kl_penalty_in_reward(batch, learner.kl_fn, learner.kl_ctl.value)
        if self.critic is not None:
            batch = stages.values_and_returns(batch, self.critic.values(batch), **algo.advantage.options)
        batch = stages.advantage(batch, self.advantage_fn)
        metrics.update({k: v for k, v in stages.rollout_metrics(batch).items() if k.startswith("adv/")})
        return batch

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        batch, metrics = self.collect_batch(step)
        if batch.size == 0:
            metrics["skipped"] = 1.0  # every group was filtered out: nothing to learn from this step
            return metrics
        learner = self.learner
        with self.clock("learner"):
            batch = self.prepare(batch, metrics)
            metrics.update(learner.train_step(batch, step))
            if self.critic is not None:
                metrics.update(self.critic.train_step(batch))
            if learner.ref is not None:
                metrics["kl_coef"] = learner.kl_ctl.value
                learner.update_kl_coef(metrics.get("kl", 0.0), batch.size)
        with self.clock("sync"):
            self.sync_weights()
        return metrics
