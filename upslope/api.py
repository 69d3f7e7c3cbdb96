"""Python API: `upslope.train(config)` and one entry point per trainer command."""
from __future__ import annotations

import importlib
from typing import Any

from upslope.config import Config, load_config

# command -> "module:class" of the BaseTrainer subclass that runs it (imported on use)
TRAINERS = {
    "train": "upslope.train.trainers.rl:Trainer",
    "sft": "upslope.train.trainers.sft:SFTTrainer",
    "rft": "upslope.train.trainers.rft:RFTTrainer",
    "distill": "upslope.train.trainers.distill:DistillTrainer",
    "dpo": "upslope.train.trainers.dpo:DPOTrainer",
    "rm": "upslope.train.trainers.rm:RMTrainer",
    "randopt": "upslope.train.trainers.randopt:RandOptTrainer",
}


def trainer_class(command: str) -> type:
    module, _, name = TRAINERS[command].partition(":")
    return getattr(importlib.import_module(module), name)


def run_trainer(command: str, config: Config | str | None = None,
                overrides: list[str] | None = None) -> dict[str, Any]:
    """Build the command's trainer from a Config (or a recipe path plus overrides), run it and
    release its engine; returns the before/after evaluation."""
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    trainer = trainer_class(command)(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()


def train(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Online RL (GRPO and the algorithm recipes)."""
    return run_trainer("train", config, overrides)


def sft(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope sft` from Python: supervised fine-tuning (and DFT)."""
    return run_trainer("sft", config, overrides)


def rft(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope rft` from Python: rejection-sampling fine-tuning."""
    return run_trainer("rft", config, overrides)


def dpo(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope dpo` from Python: preference optimisation (DPO, IPO, SimPO)."""
    return run_trainer("dpo", config, overrides)


def distill(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope distill` from Python: on-policy distillation."""
    return run_trainer("distill", config, overrides)


def rm(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope rm` from Python: reward-model training (Bradley-Terry)."""
    return run_trainer("rm", config, overrides)


def randopt(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope randopt` from Python: gradient-free weight-space search (RandOpt / ES / CoRP)."""
    return run_trainer("randopt", config, overrides)
