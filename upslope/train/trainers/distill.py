"""On-policy distillation (`upslope distill`): the student samples through the engine, a
teacher scores the same tokens (once per rollout batch), the student is updated toward the
teacher with a distillation loss, and its weights go back to the engine. With
`distill.teacher: self` the teacher is the student's own frozen starting weights at
`distill.teacher_temperature` (TS-OPSD self-distillation)."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from upslope.batch import Batch
from upslope.errors import ConfigError, UpslopeError
from upslope.registry import DISTILL_LOSSES
from upslope.train.collect import Rounds
from upslope.seeding import seed_step
from upslope.train.loop import BaseTrainer
from upslope.train.learner.objectives import DistillObjective
from upslope.train.methods.teacher import Teacher


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
        self.rounds = Rounds(want=cfg.rollout.prompts_per_step, merge_repeats=self.merge_repeats)
        bound = DISTILL_LOSSES.bind(cfg.distill.loss.name, cfg.distill.loss.options, where="distill.loss.options")
        # a loss registered as a class keeps state across steps (ARKD's learned weighting): one instance a run
        self.loss = bound() if inspect.isclass(DISTILL_LOSSES.get(cfg.distill.loss.name).fn) else bound
        self.teacher = Teacher(cfg.distill, cfg.model, self.runtime.model_path, self.runtime.tokenizer,
                               announce=self.report.note)

    def title(self) -> str:
        return f"distill ({self.cfg.distill.loss.name})"

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        # rewards (when configured) only say how good the student's samples are; the update does not use them
        got = self.source.next(step)
        batch, metrics = got.batch, got.metrics
        with self.clock("teacher"):
            passes = self.teacher.forward_passes
            batch = self.teacher.score(batch, self.updater)
            metrics["distill/teacher_forwards"] = float(self.teacher.forward_passes - passes)
        with self.clock("learner"):
            metrics.update(self.update(batch, step))
            if hasattr(self.loss, "after_update"):  # once per step: a stateful loss's own update
                metrics.update(self.loss.after_update(metrics))
        with self.clock("sync"):
            self.push_weights()
        return metrics

    def extra_state(self) -> dict[str, Any]:
        own = self.loss.state_dict() if hasattr(self.loss, "state_dict") else {}
        return {"distill_loss": own} if own else {}

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        if "distill_loss" in state:
            self.loss.load_state_dict(state["distill_loss"])
        elif hasattr(self.loss, "state_dict") and self.loss.state_dict():  # it learns, and the checkpoint lacks it
            raise UpslopeError(f"{path}: checkpoint has no state of distill.loss {self.cfg.distill.loss.name}")

    def setup_objective(self) -> None:
        cfg = self.cfg
        self.teacher.load(self.updater)  # beside the student (across ranks: sharded like it)
        self.objective = DistillObjective(self.loss, cfg.algo, cfg.train, temperature=cfg.rollout.temperature or 1.0,
                                          max_new_tokens=cfg.rollout.max_new_tokens or 0)

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """The update with the distillation loss; the student's log-probs at the teacher's top-k
        ids come from the same forward (with gradient)."""
        return self.updater.update(batch, step, self.objective)
