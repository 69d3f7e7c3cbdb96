"""The rollout contract: where a step's batch comes from and where the learner's weights go.

A `BatchSource` gives the collected batch of a step (`next(step) -> Collected`): the local collector
here (this process's engine) or the Ray pipeline (`upslope.train.pipeline`, rollout workers). A
`WeightSink` takes the learner's weights after an update (`push(weights, version)`): the local
engine here, or the Ray workers (the pipeline is both a source and a sink). The training loop only
ever reads a source and pushes to a sink, so it has no branch for either."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Protocol

import torch

from upslope.batch import Batch
from upslope.config import Config
from upslope.distributed import group
from upslope.engine import SamplingParams
from upslope.rollout.plugin import RolloutFn
from upslope.runtime import Runtime
from upslope.seeding import step_seed
from upslope.train.collect import Collected, Keep, Rounds, Task, collect, on_engine
from upslope.train.learner.memory import release_freed_memory
from upslope.train.timing import StageClock

if TYPE_CHECKING:
    from upslope.train.learner.stream import StreamedUpdate

Weights = Iterable[tuple[str, torch.Tensor]]  # the learner's parameters by HF name


class BatchSource(Protocol):
    """Where a step's batch comes from."""

    streams: bool  # can it hand a step's kept groups to a streamed update as they arrive?
    last_seen: Batch | None  # everything the latest `next` sampled, scored (the run's completion table)

    def start(self) -> None:
        """Start what it generates with (before step 1, so no step's timing includes its start-up)."""

    def next(self, step: int, stream: StreamedUpdate | None = None) -> Collected:
        """The collected batch of `step` (every learner rank gets it; with `stream`, the kept groups go
        to it as they arrive and it works while the learner waits)."""

    def step_metrics(self, clock: StageClock, step: int) -> dict[str, float]:
        """What the source measured over the step (e.g. the pipeline's lags and worker loads)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep of the source (e.g. steps drawn ahead)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""

    def close(self) -> None:
        """Release what the source holds."""


class WeightSink(Protocol):
    """Where the learner's weights go after an update."""

    def push(self, weights: Weights, version: int) -> None:
        """Take the learner's weights of `version` (updates made so far). Every learner rank calls it:
        across ranks the weights are gathered from the shards while they are read."""


def step_sampling(cfg: Config, stop_ids: list[int], step: int) -> SamplingParams:
    """The sampling parameters of a step's first collect round (round r samples with seed + r);
    nothing is seeded (groups generated ahead use it too)."""
    r = cfg.rollout
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, seed=step_seed(cfg.train.seed, step) ^ cfg.engine.seed,
                          stop_token_ids=list(stop_ids), routed_experts=cfg.algo.routing_replay)


def step_rounds(rounds: Rounds, cfg: Config, step: int) -> Rounds:
    """`rounds` reseeding every RNG from (run seed, step) at the start of each round."""
    return replace(rounds, reseed=step_seed(cfg.train.seed, step))


class LocalCollector:
    """The batch source of one process: the collect stage on the in-process engine with the run's
    rollout plugin. Across learner ranks rank 0 collects and broadcasts; the engine then sleeps
    (a GPU-colocated engine frees its memory for the learner until the next push)."""

    streams = False

    def __init__(self, cfg: Config, runtime: Runtime, task: Task, sampler: Any, rounds: Rounds, keep: Keep | None,
                 rollout: RolloutFn, clock: StageClock):
        self.cfg, self.runtime, self.task, self.sampler = cfg, runtime, task, sampler
        self.rounds, self.keep, self.rollout, self.clock = rounds, keep, rollout, clock
        self.last_seen: Batch | None = None

    def start(self) -> None:
        if group.is_main():
            self.runtime.engine

    def next(self, step: int, stream: StreamedUpdate | None = None) -> Collected:
        if not group.is_main():
            return group.broadcast(None)
        engine = self.runtime.engine
        got = collect(self.task, on_engine(engine, self.rollout, self.task.pad_id), self.sampler.next,
                      step_sampling(self.cfg, self.runtime.stop_ids, step), step_rounds(self.rounds, self.cfg, step),
                      self.keep, clock=self.clock)
        got.metrics["rollout/engine_on_gpu"] = float(engine.device.startswith("cuda"))
        engine.sleep()
        self.last_seen = got.seen
        return group.broadcast(got)

    def step_metrics(self, clock: StageClock, step: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class EngineSink:
    """The in-process engine as a weight sink (started on first use): rank 0 loads the weights, the
    other ranks only take part in gathering them; then the update's freed memory goes back to the OS."""

    def __init__(self, runtime: Runtime, device: torch.device):
        self.runtime, self.device = runtime, device

    def push(self, weights: Weights, version: int) -> None:
        if not group.is_main():
            for _ in weights:
                pass
            return
        self.runtime.engine.update_weights(weights)
        release_freed_memory(self.device)
