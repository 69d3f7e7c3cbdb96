"""Python API: `upslope.train(config)` and one entry point per trainer command."""
from __future__ import annotations

import importlib
from typing import Any

from upslope.config import Config, load_config

# command -> "module:class" of the BaseTrainer subclass that runs it (imported on use)
TRAINERS = {
    "train": "upslope.train.loop:Trainer",
    "sft": "upslope.train.sft:SFTTrainer",
    "rft": "upslope.train.rft:RFTTrainer",
    "distill": "upslope.train.distill:DistillTrainer",
    "dpo": "upslope.train.dpo:DPOTrainer",
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
