"""Running a trainer command: the command -> trainer table, one trainer in this process
(`run_trainer`), and `launch`, which checks the options and runs the trainer in
`dist.learner_procs` learner ranks on this machine (spawned here), in this process alone, or as
one rank that torchrun started (RANK / WORLD_SIZE set). The command line and the Python API
(`upslope.api`) both launch; a spawned rank imports the run's plugin modules before it builds
anything, because a config that crossed a process boundary does not import them again."""
from __future__ import annotations

import importlib
import sys
from typing import Any

from upslope.config import Config
from upslope.distributed import group
from upslope.distributed.shard import check_combination
from upslope.errors import ConfigError, UpslopeError
from upslope.plugins import import_plugins

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


class RankFailed(UpslopeError):
    """A spawned learner rank exited with an error; rank 0 printed its one line already."""

    def __init__(self, exit_code: int):
        super().__init__(f"a learner rank exited with status {exit_code}")
        self.exit_code = exit_code


def trainer_class(command: str) -> type:
    module, _, name = TRAINERS[command].partition(":")
    return getattr(importlib.import_module(module), name)


def run_trainer(command: str, cfg: Config) -> dict[str, Any]:
    """The command's trainer on `cfg` in this process, run and closed; its before/after evaluation."""
    trainer = trainer_class(command)(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()


def _rank(command: str, cfg: Config) -> None:
    """One spawned rank: the run's plugins, then the trainer; an UpslopeError is one line (from rank 0) and exit 2."""
    try:
        import_plugins(cfg.plugins)
        run_trainer(command, cfg)
    except UpslopeError as exc:
        if group.is_main():
            print(f"upslope: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


def launch(command: str, cfg: Config) -> dict[str, Any]:
    """Run `command` on `cfg` with its learner across `dist.learner_procs` processes: the before/after
    evaluation when it ran in this process ({} from spawned ranks); RankFailed when a rank failed."""
    from upslope.cache import keep_compiler_cache
    from upslope.models import resolve_model
    from upslope.train.learner.updater import default_device

    keep_compiler_cache(cfg.model.cache_dir)  # first: a trainer's set-up imports torch's compiler, which makes its cache
    procs, env = cfg.dist.learner_procs, group.env_world_size()
    check_combination(cfg.dist, cfg.optim, cfg.model, default_device())
    if env > 1 or procs == 1:  # torchrun started this rank, or one process
        if env > 1 and procs not in (1, env):
            raise ConfigError(f"dist.learner_procs={procs}, but torchrun started {env} processes (WORLD_SIZE); "
                              f"set them equal or leave dist.learner_procs at 1")
        return run_trainer(command, cfg)
    # convert or download the model once here, not in every rank at the same time
    resolve_model(cfg.model.name, cfg.model.gguf_file, cfg.model.cache_dir)
    import torch.multiprocessing as mp

    try:
        group.spawn(_rank, procs, command, cfg)
    except mp.ProcessExitedException as exc:  # a rank's one-line error was printed; a crash has its traceback
        raise RankFailed(exc.exit_code) from None
    return {}
