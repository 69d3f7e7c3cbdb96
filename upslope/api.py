"""Python API: `upslope.train(config)` and one entry point per trainer command. Each runs what the
command line runs: the config loaded (a Config, or a recipe path plus overrides), the run directory
checked, and the trainer launched on `dist.learner_procs` learner ranks (`upslope.launch`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from upslope.config import Config, load_config
from upslope.fsutil import check_run_dir
from upslope.launch import launch


def run(command: str, config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Run the trainer command `command` on a Config (or a recipe path plus overrides); returns the
    before/after evaluation (empty when the trainer ran in spawned learner ranks)."""
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    check_run_dir(Path(cfg.run_dir), resuming=bool(cfg.train.resume))
    return launch(command, cfg)


def train(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Online RL (GRPO and the algorithm recipes)."""
    return run("train", config, overrides)


def sft(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope sft` from Python: supervised fine-tuning (and DFT)."""
    return run("sft", config, overrides)


def rft(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope rft` from Python: rejection-sampling fine-tuning."""
    return run("rft", config, overrides)


def dpo(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope dpo` from Python: preference optimisation (DPO, IPO, SimPO)."""
    return run("dpo", config, overrides)


def distill(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope distill` from Python: on-policy distillation."""
    return run("distill", config, overrides)


def rm(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope rm` from Python: reward-model training (Bradley-Terry)."""
    return run("rm", config, overrides)


def randopt(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """`upslope randopt` from Python: gradient-free weight-space search (RandOpt / ES / CoRP)."""
    return run("randopt", config, overrides)
