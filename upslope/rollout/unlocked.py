"""The `multi_turn_unlocked` rollout: multi_turn's trajectories (the same environment, tools, limits,
token sequences and masks), each advancing on its own thread as soon as its environment has answered.

`multi_turn` runs turns in lockstep: every unfinished trajectory's turn is one engine call, and the
next call waits until every environment (every tool call, one after another) has answered. Here a
trajectory's next turn joins the engine's next call as soon as its own tools return, tools of different
trajectories run at the same time, and `concurrency` bounds the trajectories in flight. Engine calls
then hold whatever turns are waiting, so their composition depends on timing: a seeded run is not
reproducible turn for turn as a lockstep one is."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from upslope.agents.engine_queue import GenerationQueue
from upslope.batch import Batch
from upslope.bounds import NonNegative, PositiveCount
from upslope.data.types import Example
from upslope.engine import Engine, SamplingParams
from upslope.errors import UpslopeError
from upslope.registry import ROLLOUTS
from upslope.rollout.multi_turn import AgentRun, Trajectory, finish, take_turn, trajectories_batch

if TYPE_CHECKING:
    from upslope.config import Config


def advance(run: AgentRun, queue: GenerationQueue, tr: Trajectory, params: SamplingParams, stop_ids: set[int]) -> None:
    """Run one trajectory to its end: a turn through the queue, the environment's answer, the next turn."""
    budget = params.max_new_tokens
    queue.open_caller()
    try:
        for _ in range(run.cfg.max_turns):
            if tr.done:
                break
            limit = min(run.cfg.max_turn_tokens or budget, budget - len(tr.ids))
            comp = queue.generate(tr.prompt + tr.ids, replace(params, n=1, max_new_tokens=limit))
            take_turn(run, tr, comp, limit, budget, stop_ids)
    finally:
        queue.close_caller()


def run_unlocked(run: AgentRun, engine: Engine, examples: Sequence[Example], params: SamplingParams,
                 group_offset: int = 0, *, concurrency: int = 64, gather_s: float = 0.02) -> list[Trajectory]:
    """`params.n` trajectories per example, each on its own thread, at most `concurrency` at once."""
    trajs = [run.start(ex, group_offset + g) for g, ex in enumerate(examples) for _ in range(params.n)]
    stop_ids = set(params.stop_token_ids or [run.tokenizer.eos_token_id])
    queue = GenerationQueue(engine, seed=params.seed, gather_s=gather_s, max_batch=max(1, min(concurrency, len(trajs))))
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="upslope-trajectory") as pool:
            list(pool.map(lambda tr: advance(run, queue, tr, params, stop_ids), trajs))
    finally:
        queue.close()
    finish(trajs)
    return trajs


def multi_turn_unlocked_batch(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                              params: SamplingParams, pad_id: int, group_offset: int = 0, *, run: AgentRun,
                              concurrency: int = 64, gather_s: float = 0.02) -> Batch:
    """The unlocked trajectories as a Batch, as multi_turn builds it (environment tokens masked, the SFT term)."""
    trajs = run_unlocked(run, engine, examples, params, group_offset, concurrency=concurrency, gather_s=gather_s)
    return trajectories_batch(run, trajs, params, pad_id, engine.version)


def build_multi_turn_unlocked(cfg: Config, tokenizer: Any, evaluation: bool = False) -> Callable[..., Batch]:
    """The unlocked rollout bound to this run's agent section, options and tokenizer (evaluation: no guidance)."""
    options = ROLLOUTS.bind(cfg.rollout.kind, cfg.rollout.options, "rollout.options").keywords
    return functools.partial(multi_turn_unlocked_batch, run=AgentRun.from_config(cfg, tokenizer, guidance=not evaluation),
                             concurrency=options.get("concurrency", 64),
                             gather_s=options.get("gather_ms", 20.0) / 1000)


@ROLLOUTS.register("multi_turn_unlocked", setup=build_multi_turn_unlocked)
def multi_turn_unlocked(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                        params: SamplingParams, pad_id: int, group_offset: int = 0, *,
                        concurrency: PositiveCount = 64, gather_ms: NonNegative = 20.0) -> Batch:
    """multi_turn without lockstep: each trajectory's next turn starts as soon as its own environment answers.

    concurrency: most trajectories in flight at once
    gather_ms: how long the engine waits for more turns before generating (cut short when every trajectory in flight is waiting)
    """
    raise UpslopeError("rollout.kind=multi_turn_unlocked needs the run's agent section: get it with "
                       "upslope.rollout.plugin.make_rollout(cfg, tokenizer)")
