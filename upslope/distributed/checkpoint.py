"""Sharded checkpoints of the learner with torch.distributed.checkpoint (DCP): each rank
writes its shards of the weights and the optimiser state, and a checkpoint loads into any
number of processes (DCP reshards on load; one process reads it without a process group)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from upslope.distributed.shard import state_module


# a LoRA run's frozen base is not checkpointed (and so not expected back: DCP's load already fails
# on a trained key the checkpoint lacks)
TRAINED = StateDictOptions(ignore_frozen_params=True, strict=False)


def save_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Write the trained parameters' and the optimiser's state (this rank's shards) under `path`
    (every rank calls it). Frozen parameters (a LoRA adapter's base) are left out: they are the
    model the run loads anyway."""
    model_sd, optim_sd = get_state_dict(state_module(model), optimizer, options=TRAINED)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), no_dist=not dist.is_initialized())


def load_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Read what `save_sharded` wrote, into this run's layout (any number of ranks; every rank calls it)."""
    model_sd, optim_sd = get_state_dict(state_module(model), optimizer, options=TRAINED)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_state_dict(state_module(model), optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=TRAINED)


def gathered_weights(model: Any) -> dict[str, torch.Tensor]:
    """The full weights by HF name in CPU memory on rank 0 (empty elsewhere), for an HF-format
    export (every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(state_module(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full(model: Any, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
              optim_state: dict[str, Any]) -> None:
    """A one-process checkpoint (full weights by HF name; torch's optimiser state dict, keyed by the
    position of each trainable parameter) into this rank's shards (every rank calls it with the whole)."""
    model = state_module(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    by_name = {"state": {names[i]: v for i, v in optim_state["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]]}
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=by_name,
                   options=StateDictOptions(full_state_dict=True, strict=False))
