"""`upslope train dist.learner_procs=N`: check the options, then run the trainer in N learner
ranks on this machine (spawned here), or in this process alone, or as one rank that torchrun
started (RANK / WORLD_SIZE set)."""
from __future__ import annotations

import sys

from upslope.config import Config, load_config
from upslope.distributed import group
from upslope.distributed.shard import check_combination
from upslope.errors import ConfigError, UpslopeError


def _rank(command: str, recipe: str | None, overrides: list[str]) -> None:
    """One spawned rank: the trainer on the same config; an UpslopeError is one line (from rank 0) and exit 2."""
    from upslope.api import run_trainer

    try:
        run_trainer(command, load_config(recipe, overrides))
    except UpslopeError as exc:
        if group.is_main():
            print(f"upslope: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


def launch(command: str, cfg: Config, recipe: str | None, overrides: list[str]) -> int:
    """Run `command` on `cfg` with its learner across `dist.learner_procs` processes; the exit status."""
    from upslope.models import resolve_model
    from upslope.api import run_trainer
    from upslope.train.learner.updater import default_device

    procs, env = cfg.dist.learner_procs, group.env_world_size()
    check_combination(cfg.dist, cfg.optim, cfg.model, default_device())
    if env > 1 or procs == 1:  # torchrun started this rank, or one process
        if env > 1 and procs not in (1, env):
            raise ConfigError(f"dist.learner_procs={procs}, but torchrun started {env} processes (WORLD_SIZE); "
                              f"set them equal or leave dist.learner_procs at 1")
        run_trainer(command, cfg)
        return 0
    # convert or download the model once here, not in every rank at the same time
    resolve_model(cfg.model.name, cfg.model.gguf_file, cfg.model.cache_dir)
    import torch.multiprocessing as mp

    try:
        group.spawn(_rank, procs, command, recipe, list(overrides))
    except mp.ProcessExitedException as exc:  # a rank's one-line error was printed; a crash has its traceback
        return 2 if exc.exit_code == 2 else 1
    return 0
