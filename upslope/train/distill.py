"""On-policy distillation (`upslope distill`): the student samples through the engine, a
teacher scores the same tokens (once per rollout batch), the student is updated toward the
teacher with a distillation loss, and its weights go back to the engine. With
`distill.teacher: self` the teacher is the student's own frozen starting weights at
`distill.teacher_temperature` (TS-OPSD self-distillation)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from upslope.algos.aggregate import aggregate
from upslope.algos.distill import DistillInputs, distill_metrics
from upslope.batch import Batch
from upslope.config import Config
from upslope.errors import ConfigError
from upslope.registry import DISTILL_LOSSES
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
                               announce=self.report.note)

    def title(self) -> str:
        return f"distill ({self.cfg.distill.loss.name})"

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        # rewards (when configured) only say how good the student's samples are; the update does not use them
        got = self.collect(step, want=self.cfg.rollout.prompts_per_step)
        batch, metrics = got.batch, got.metrics
        with self.clock("teacher"):
            passes = self.teacher.forward_passes
            batch = self.teacher.score(batch, self.learner)
            metrics["distill/teacher_forwards"] = float(self.teacher.forward_passes - passes)
        with self.clock("learner"):
            metrics.update(self.update(batch, step))
        with self.clock("sync"):
            self.sync_weights()
        return metrics

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Learner.optimize with the distillation loss; the student's log-probs at the teacher's
        top-k ids come from the same forward (with gradient)."""
        cfg, learner = self.cfg, self.learner
        algo, t = cfg.algo, cfg.train
        if t.updates_per_batch * t.epochs_per_batch > 1:  # later updates see samples of an older student
            batch = replace(batch, old_logprobs=learner.logprobs(batch))
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

