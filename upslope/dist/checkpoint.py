"""Sharded checkpoints of the learner with torch.distributed.checkpoint (DCP): each rank
writes its shards of the weights and the optimiser state, and a checkpoint loads into any
number of processes (DCP reshards on load; one process reads it without a process group)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Write the model's and the optimiser's state (this rank's shards) under `path` (every rank calls it)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), no_dist=not dist.is_initialized())


def load_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Read what `save_sharded` wrote, into this run's layout (any number of ranks; every rank calls it)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def gathered_weights(model: Any) -> dict[str, torch.Tensor]:
    """The full weights by HF name in CPU memory on rank 0 (empty elsewhere), for an HF-format export (every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
