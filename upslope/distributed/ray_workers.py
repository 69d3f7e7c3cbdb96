"""Rollout workers as Ray actors: each owns an engine built by the engine registry and the run's
rollout plugin, generates the prompt groups of the jobs it is handed, and reports the weight
version that generated them. Weights arrive as versioned state dicts through the object store.
A worker imports the run's plugin modules first: the config it receives was pickled, which does
not import them again, and the rollout plugin may be one of them."""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from upslope.batch import Batch
from upslope.config import Config
from upslope.data.types import Example
from upslope.engine import SamplingParams


@dataclass
class Job:
    """Prompt groups generated together: `key` (step, round, chunk) is also their admission
    priority (the lowest key completes the next batch first)."""

    key: tuple[int, int, int]
    indices: list[int]  # prompt indices in the task
    group_offset: int  # group id of the first prompt (unique across rounds, as in the synchronous collect)
    params: SamplingParams


@dataclass
class Done:
    """A finished job: its batch (not yet rewarded), the weight version that generated every
    sample of it, who generated it and when (wall clock, for the timeline)."""

    job: Job
    batch: Batch
    version: int
    worker: int
    start: float
    end: float
    tokens: int
    device: str = "cpu"  # where the worker's engine generated it


class RolloutWorker:
    """One rollout worker (a Ray actor when wrapped by `ray.remote`): an engine of the run's
    config and its rollout plugin, optionally pinned to one core."""

    def __init__(self, cfg: Config, worker: int, pad_id: int, cores: list[int] | None = None, nice: int = 0):
        from upslope.models import load_tokenizer, resolve_model
        from upslope.plugins import import_plugins
        from upslope.rollout.plugin import make_rollout
        from upslope.runtime import build_engine

        import_plugins(cfg.plugins)  # a user's rollout, reward or engine plugin is registered here too
        if cores:
            os.sched_setaffinity(0, cores)
        try:  # Ray starts workers at niceness 15; generation is the run's main work, so take the learner's
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except PermissionError:
            pass
        torch.set_num_threads(max(len(os.sched_getaffinity(0)), 1) if cfg.train.threads == 0 else cfg.train.threads)
        torch.use_deterministic_algorithms(cfg.train.deterministic, warn_only=True)
        self.worker = worker
        self.pad_id = pad_id
        path = resolve_model(cfg.model.name, cfg.model.gguf_file, cfg.model.cache_dir, lambda *_: None)
        self.tokenizer = load_tokenizer(path, cfg.model.chat_template, cfg.model.trust_remote_code)
        self.engine = build_engine(cfg, path, self.tokenizer)
        self.rollout = make_rollout(cfg, self.tokenizer)
        self.version = 0

    def set_weights(self, version: int, packed: Packed) -> tuple[int, float, float]:
        """Load the learner's weights of `version` (`put_weights`; Ray resolves the reference to arrays
        in the node's object store): the version and when the load started and ended (wall clock)."""
        start = time.time()
        self.engine.update_weights(unpack_weights(packed))
        self.version = version
        return version, start, time.time()

    def generate(self, job: Job, prompts: list[list[int]], examples: list[Example]) -> Done:
        """Run the rollout plugin on the job's prompts with the current weights."""
        start = time.time()
        batch = self.rollout(self.engine, prompts, examples, job.params, self.pad_id, group_offset=job.group_offset)
        return Done(job, batch, self.version, self.worker, start, time.time(), int(batch.completion_lens.sum()),
                    self.engine.device)

    def pid(self) -> int:
        """The actor's process id (to kill it in fault tests)."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()


Packed = dict[str, tuple[np.ndarray, str, tuple[int, ...]]]  # name -> (raw bytes, torch dtype name, shape)


def pack_weights(named: Iterable[tuple[str, torch.Tensor]]) -> Packed:
    """Each tensor as a uint8 numpy view of its bytes (no copy for a contiguous CPU tensor), its dtype and
    shape: Ray stores numpy arrays out of band and workers on the node read them in place (zero-copy),
    where a pickled torch tensor is copied on the way in and again on the way out."""
    out: Packed = {}
    for name, t in named:
        t = t.detach().to("cpu").contiguous()
        out[name] = (t.view(-1).view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape))
    return out


def unpack_weights(packed: Packed) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `pack_weights`, viewing the (read-only) arrays in place: an engine copies them into
    its own parameters and must not write to them."""
    with warnings.catch_warnings():  # the object store's buffers are read-only; nothing writes to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, (raw, dtype, shape) in packed.items():
            kind = getattr(torch, dtype)
            yield name, torch.from_numpy(raw).view(kind).view(shape) if raw.size else torch.empty(shape, dtype=kind)


def put_weights(named: Iterable[tuple[str, torch.Tensor]]) -> Any:
    """The learner's weights in the object store once per version (every worker on the node reads the same
    object, in place): an object ref to `pack_weights`. The one copy is ray.put's, so the live parameters
    may change as soon as it returns."""
    import ray

    return ray.put(pack_weights(named))


def start_ray(address: str) -> bool:
    """Connect to the Ray cluster at `address` ('' starts a local one) unless this process already
    is; True when this call started the connection (the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    pythonpath = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""),) if p)
    env = {"env_vars": {"PYTHONPATH": pythonpath}} if pythonpath else None
    ray.init(address=address or None, include_dashboard=False, log_to_driver=True, runtime_env=env)
    return True


def spawn_workers(cfg: Config, pad_id: int) -> list[Any]:
    """`dist.rollout_workers` actors with the configured resources, restarted by Ray up to
    `dist.max_restarts` times (a restarted actor rebuilds its engine from the model files)."""
    import ray

    d = cfg.dist
    actor = ray.remote(RolloutWorker).options(num_cpus=d.worker_cpus, num_gpus=d.worker_gpus,
                                              resources=dict(d.worker_resources) or None,
                                              max_restarts=d.max_restarts, max_task_retries=0)
    cores = [[d.worker_cores[i % len(d.worker_cores)]] if d.worker_cores else None for i in range(d.rollout_workers)]
    return [actor.remote(cfg, i, pad_id, cores[i], os.getpriority(os.PRIO_PROCESS, 0))
            for i in range(d.rollout_workers)]
