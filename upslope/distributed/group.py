"""The process group of the learner ranks: start it from a torchrun-style environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or spawn the ranks on this machine, and the few
collectives the learner needs beyond the gradient reduction."""
from __future__ import annotations

import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist


def world() -> int:
    """Learner processes (1 when no process group is running)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 when no process group is running)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0: the process that owns the engine, the data, the rewards, the logs and checkpoint metadata."""
    return rank() == 0


def backend_for(choice: str, device: torch.device) -> str:
    """The collective backend: `choice`, or with auto NCCL on GPUs and gloo on CPUs."""
    if choice != "auto":
        return choice
    return "nccl" if device.type == "cuda" else "gloo"


def env_world_size() -> int:
    """WORLD_SIZE from the environment (torchrun or `spawn` set it), 1 when absent."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(backend: str, device: torch.device) -> None:
    """Join the process group described by the environment (a no-op for one process or when joined)."""
    if env_world_size() <= 1 or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend_for(backend, device))


def free_port() -> int:
    """A TCP port free on this machine now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(local_rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        fn(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable[..., Any], procs: int, *args: Any) -> None:
    """Run `fn(*args)` in `procs` new processes on this machine with a torchrun-style environment
    (each joins the group through `init_from_env`); returns when all have finished, raises if one failed."""
    import torch.multiprocessing as mp

    mp.start_processes(_rank_main, args=(procs, free_port(), fn, args), nprocs=procs, join=True, start_method="spawn")


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled; for batches and small metadata)."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_sums(sums: dict[str, float]) -> dict[str, float]:
    """Each key's sum over the ranks (ranks may hold different keys)."""
    if world() == 1:
        return dict(sums)
    parts: list[Any] = [None] * world()
    dist.all_gather_object(parts, dict(sums))
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out


def gather_lists(items: list[Any]) -> list[Any]:
    """Every rank's `items` concatenated in rank order (pickled; for small per-pair records)."""
    if world() == 1:
        return list(items)
    parts: list[Any] = [None] * world()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def barrier() -> None:
    """Wait for every rank (a no-op in one process)."""
    if world() > 1:
        dist.barrier()
