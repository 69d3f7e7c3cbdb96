"""On-policy distillation (`upslope distill`): the student samples through the engine, a
teacher scores the same tokens (once per rollout batch), the student is updated toward the
teacher with a distillation loss, and its weights go back to the engine. With
`distill.teacher: self` the teacher is the student's own frozen starting weights at
`distill.teacher_temperature` (TS-OPSD self-distillation)."""
from __future__ import annotations

import time
from typing import Any

import torch

from upslope.algos.aggregate import aggregate
from upslope.algos.distill import DistillInputs, distill_metrics
from upslope.batch import Batch
from upslope.config import Config
from upslope.errors import ConfigError
from upslope.logs.progress import console
from upslope.registry import DISTILL_LOSSES
from upslope.train import stages
from upslope.train.loop import BaseTrainer, seed_step
from upslope.train.teacher import Teacher


class DistillTrainer(BaseTrainer):
    """rollout (student) -> optional reward, for logging -> teacher scores -> distillation update -> sync."""

    def check_config(self) -> None:
        cfg = self.cfg
        if not cfg.distill.teacher:
            raise ConfigError("distill.teacher: no teacher given; set distill.teacher=PATH (a model, a checkpoint "
                              "RUN/checkpoints/step_N or a run directory) or distill.teacher=self")
        if cfg.algo.kl_coef > 0:
            raise ConfigError(f"algo.kl_coef={cfg.algo.kl_coef}: distill pulls the student toward the teacher, "
                              f"not a reference model; set algo.kl_coef=0")
        DISTILL_LOSSES.get(cfg.distill.loss.name, "distill.loss.name")
        DISTILL_LOSSES.bind(cfg.distill.loss.name, cfg.distill.loss.options, where="distill.loss.options")

    def setup(self) -> None:
        cfg = self.cfg
        self.setup_task(rewards=cfg.distill.log_reward)
        self.loss = DISTILL_LOSSES.bind(cfg.distill.loss.name, cfg.distill.loss.options,
                                        where="distill.loss.options")
        self.teacher = Teacher(cfg, self.runtime.model_path, self.runtime.tokenizer, self.device,
                               announce=lambda m: console.print(f"[dim]{m}[/dim]"))

    def title(self) -> str:
        return f"distill ({self.cfg.distill.loss.name})"

    def step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        seed_step(cfg.train.seed, step)
        t0 = time.perf_counter()
        idx = self.sampler.next(cfg.rollout.prompts_per_step)
        batch = stages.rollout(self.runtime.engine, [self.prompt_ids[i] for i in idx],
                               [self.examples[i] for i in idx], self.sampling(step),
                               self.runtime.tokenizer.pad_token_id)
        t1 = time.perf_counter()
        metrics: dict[str, Any] = {}
        if self.reward_fns:  # how good the student's samples are; the update does not use it
            batch, metrics = stages.reward(batch, self.reward_fns, self.combiner, cfg.reward_fallback)
        metrics.update(stages.rollout_metrics(batch))
        metrics["rollout/generated_tokens"] = float(batch.completion_lens.sum())
        t2 = time.perf_counter()
        passes = self.teacher.forward_passes
        batch = self.teacher.score(batch, self.learner)
        metrics["distill/teacher_forwards"] = float(self.teacher.forward_passes - passes)
        t3 = time.perf_counter()
        metrics.update(self.update(batch, step))
        t4 = time.perf_counter()
        self.sync_weights()
        t5 = time.perf_counter()
        metrics.update({"time/rollout": t1 - t0, "time/reward": t2 - t1, "time/teacher": t3 - t2,
                        "time/learner": t4 - t3, "time/sync": t5 - t4, "time/step": t5 - t0})
        metrics["rollout/tokens_per_s"] = metrics["rollout/generated_tokens"] / max(t1 - t0, 1e-9)
        return metrics

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Learner.optimize with the distillation loss; the student's log-probs at the teacher's
        top-k ids come from the same forward (with gradient)."""
        cfg, learner = self.cfg, self.learner
        algo, t = cfg.algo, cfg.train
        if t.updates_per_batch * t.epochs_per_batch > 1:  # later updates see samples of an older student
            batch.old_logprobs = learner.logprobs(batch)
        constant = algo.loss_agg_constant or float(cfg.rollout.max_new_tokens)

        def loss_fn(lp: torch.Tensor, ent: torch.Tensor, mb: Batch, norms: dict[str, float],
                    gathered: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            x = DistillInputs(lp, mb.teacher_logprobs, mb.loss_mask, gathered, mb.teacher_topk_logprobs,
                              mb.old_logprobs)
            per_token, loss_metrics = self.loss(x)
            if algo.entropy_coef:
                per_token = per_token - algo.entropy_coef * ent
            loss = aggregate(per_token, mb.loss_mask, algo.loss_agg, num_tokens=norms["num_tokens"],
                             num_seqs=norms["num_seqs"], constant=constant)
            return loss, {**distill_metrics(x), **loss_metrics}

        return learner.optimize(batch, step, loss_fn, gather=lambda mb: mb.teacher_topk_ids)


def distill(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope distill` from Python: a Config (or a recipe path plus overrides); returns the before/after eval."""
    from upslope.train.api import run_trainer

    return run_trainer("distill", config, overrides)

