"""The Ray pipeline, a batch source and a weight sink (`upslope.train.sources`): the asynchronous
pipeline between rollout workers (Ray actors) and the learner. Jobs of prompt
groups are admitted up to `pipeline.max_staleness` steps ahead of the learner, handed out lowest
(step, round) first so the next batch completes first, and their groups come back tagged with the
weight version that generated them. Too-stale groups are dropped and regenerated; a worker that
dies is restarted by Ray, gets the current weights again, and its jobs are re-issued.

max_staleness=0 admits a step only after the previous update, one job per rollout round: with one
worker the batches, and so the run, are those of the synchronous loop."""
from __future__ import annotations

import heapq
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import torch

from upslope.batch import Batch, concat
from upslope.config import Config
from upslope.distributed.ray_workers import Done, Job, put_weights, spawn_workers, start_ray
from upslope.engine import SamplingParams
from upslope.errors import ConfigError
from upslope.train.collect import Collected, Keep, Rounds, Task, collect
from upslope.train.learner.memory import release_freed_memory
from upslope.train.sources import Weights, step_rounds, step_sampling
from upslope.train.timing import StageClock

if TYPE_CHECKING:
    from upslope.train.learner.stream import StreamedUpdate


def staleness_warning(cfg: Config) -> str | None:
    """One line when samples may lag the learner and nothing bounds their update (`pipeline.stale_correction=
    uncorrected`, the ratio against the learner's own log-probs and no algo.correction): they are then trained as
    if on-policy (on the default task, max_staleness=2 that way lost 15-25 points of held-out accuracy;
    docs/distributed.md)."""
    k = cfg.pipeline.max_staleness
    if k == 0 or cfg.algo.correction is not None or cfg.algo.old_policy == "sampler":
        return None
    return (f"pipeline.max_staleness={k} with the ratio against the learner's own log-probs and no algo.correction: "
            f"samples up to {k} weight versions old are trained as if on-policy; set pipeline.stale_correction=clip "
            f"(the default) to bound their update, and leave algo.old_policy unset (docs/distributed.md)")


class RolloutPipe:
    """Admission, dispatch, the buffer of finished groups and the weight push for N rollout workers."""

    def __init__(self, cfg: Config, task: Task, pad_id: int, version: int, warn: Callable[[str], None] = print):
        import ray

        self.cfg, self.task, self.pad_id, self.warn = cfg, task, pad_id, warn
        self.p = cfg.pipeline
        self.started_ray = start_ray(cfg.dist.address)
        self.workers = spawn_workers(cfg, pad_id)
        ray.get([w.pid.remote() for w in self.workers])  # every engine is up before step 1 is timed
        self.version = version  # the learner's: updates made so far
        self.weights: Any = None  # object ref of the current versioned state dict
        self.queue: list[tuple[tuple[int, int, int], int, Job]] = []  # admitted, not yet dispatched
        self.seq = 0
        self.inflight: dict[Any, tuple[int, Job]] = {}  # object ref -> (worker, job)
        self.discard: set[Any] = set()  # in flight at a weight change with partial=discard
        self.loads: dict[Any, int] = {}  # set_weights call in flight -> worker
        self.buffer: dict[tuple[int, int], list[Done]] = {}  # finished, waiting for the learner
        self.admitted: dict[int, list[int]] = {}  # step -> its round-0 prompt indices (drawn ahead)
        self.next_step = version + 1  # the first step not admitted yet
        self.stats: Counter[str] = Counter()
        self.lags: Counter[int] = Counter()
        self.events: list[dict[str, Any]] = []  # the timeline: who was busy when
        self.restarts = 0

    # ------------------------------------------------------------------ admission

    def admissible(self, step: int) -> bool:
        """A step's groups may be generated once the learner is at most max_staleness versions behind."""
        return step - 1 - self.version <= self.p.max_staleness

    def admit(self, step: int, round_: int, indices: Sequence[int], params: SamplingParams, group_offset: int) -> None:
        """Queue the jobs of one rollout round (split into chunk_groups prompts each)."""
        chunk = self.p.chunk_groups or max(len(indices), 1)
        for c, start in enumerate(range(0, len(indices), chunk)):
            job = Job((step, round_, c), list(indices[start:start + chunk]), group_offset + start, params)
            self.enqueue(job)
        self.stats[f"jobs/{step}/{round_}"] = (len(indices) + chunk - 1) // chunk

    def enqueue(self, job: Job) -> None:
        heapq.heappush(self.queue, (job.key, self.seq, job))
        self.seq += 1

    def prefetch(self, upto: int, draw: Callable[[int], Sequence[int]], per_round: int,
                 params: Callable[[int], SamplingParams]) -> None:
        """Draw and admit round 0 of every step up to `upto` that staleness allows."""
        while self.next_step <= upto and self.admissible(self.next_step):
            self.admit_step(self.next_step, list(draw(per_round)), params(self.next_step))
        self.dispatch()

    def admit_step(self, step: int, indices: list[int], params: SamplingParams) -> None:
        """Admit round 0 of `step` (the next one not admitted yet)."""
        self.admitted[step] = indices
        self.admit(step, 0, indices, params, 0)
        self.next_step = step + 1

    # ------------------------------------------------------------------ dispatch and results

    def dispatch(self) -> None:
        """Hand queued jobs, lowest key first, to workers with room (queue_depth each)."""
        load = Counter(w for w, _ in self.inflight.values())
        while self.queue:
            free = [i for i in range(len(self.workers)) if load[i] < self.p.queue_depth]
            if not free:
                return
            worker = min(free, key=lambda i: load[i])
            _, _, job = heapq.heappop(self.queue)
            prompts = [self.task.prompt_ids[i] for i in job.indices]
            examples = [self.task.examples[i] for i in job.indices]
            self.inflight[self.workers[worker].generate.remote(job, prompts, examples)] = (worker, job)
            load[worker] += 1

    def harvest(self, timeout: float | None) -> None:
        """Move finished jobs into the buffer (waiting up to `timeout` s for the first); a job whose
        worker died is re-issued after Ray restarted the worker and it has the current weights."""
        import ray

        self.loaded()
        if not self.inflight:
            return
        ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
        for ref in ready:
            if ref not in self.inflight:  # re-issued already: its worker died and was restarted
                continue
            worker, job = self.inflight.pop(ref)
            try:
                done: Done = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self.restart(worker, job, exc)
                continue
            self.events.append({"who": f"worker{worker}", "start": done.start, "end": done.end,
                                "version": done.version, "step": job.key[0]})
            self.stats[f"busy_s/{worker}"] += done.end - done.start
            self.stats[f"tokens/{worker}"] += done.tokens
            if ref in self.discard:
                self.discard.discard(ref)
                self.stats["discarded_groups"] += len(job.indices)
                self.enqueue(job)
                continue
            self.buffer.setdefault(job.key[:2], []).append(done)
        self.dispatch()

    def restart(self, worker: int, job: Job, exc: Exception) -> None:
        """Re-push the current weights to a worker Ray restarted (its new engine has the initial
        ones) and re-issue its job; the run goes on."""
        import ray

        self.restarts += 1
        self.warn(f"rollout worker {worker} died ({type(exc).__name__}); Ray restarts it "
                  f"(restart {self.restarts}); re-pushing weights v{self.version} and re-issuing "
                  f"its jobs (step {job.key[0]} first)")
        handle = self.workers[worker]
        deadline = time.time() + 300
        while True:  # calls fail while the actor is being restarted
            try:
                ray.get(handle.pid.remote(), timeout=60)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        if self.weights is not None:
            ray.get(handle.set_weights.remote(self.version, self.weights))
        self.enqueue(job)
        for ref in [r for r, (w, _) in self.inflight.items() if w == worker]:  # lost with the same process
            self.enqueue(self.inflight.pop(ref)[1])
            self.discard.discard(ref)

    def arrivals(self, step: int, round_: int, idle: Callable[[], bool] | None = None) -> Iterator[Done]:
        """The finished jobs of (step, round), one at a time as they arrive, each with weights at most
        max_staleness versions old (older ones are dropped, counted and regenerated). While none is
        ready, `idle()` may do other work (the learner's streamed micro-batches); it returns False
        when it has none, and then this waits."""
        key = (step, round_)
        want, got = self.stats[f"jobs/{step}/{round_}"], 0
        self.dispatch()
        while got < want:
            for done in self.buffer.pop(key, []):
                lag = self.version - done.version
                if lag > self.p.max_staleness:
                    self.stats["dropped_stale_groups"] += len(done.job.indices)
                    self.enqueue(done.job)
                    continue
                self.lags[lag] += len(done.job.indices)
                got += 1
                yield done
            if got < want:
                self.dispatch()
                self.harvest(timeout=0)
                if key not in self.buffer and not (idle is not None and idle()):
                    self.harvest(timeout=None)

    def take(self, step: int, round_: int) -> list[Done]:
        """All the finished jobs of (step, round), in order (see `arrivals`)."""
        return sorted(self.arrivals(step, round_), key=lambda d: d.job.key)

    def push(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Put the learner's weights of `version` in the object store once and send every worker the
        reference; with partial=discard, the groups in flight now are regenerated. The seconds taken."""
        t0 = time.perf_counter()
        self.harvest(timeout=0)
        self.version = version
        self.weights = put_weights(named)
        for i, w in enumerate(self.workers):
            self.loads[w.set_weights.remote(version, self.weights)] = i
        if self.p.partial == "discard":
            self.discard = set(self.inflight)
        seconds = time.perf_counter() - t0
        self.events.append({"who": "push", "start": time.time() - seconds, "end": time.time(), "version": version})
        return seconds

    def loaded(self) -> None:
        """Record the weight loads the workers have finished (the timeline's `load` bars, the
        `pipeline/weight_load_s` metric); a load lost with a dead worker is re-pushed by `restart`."""
        import ray

        if not self.loads:
            return
        ready, _ = ray.wait(list(self.loads), num_returns=len(self.loads), timeout=0)
        for ref in ready:
            worker = self.loads.pop(ref)
            try:
                version, start, end = ray.get(ref)
            except ray.exceptions.RayActorError:
                continue
            self.events.append({"who": f"worker{worker}", "kind": "load", "start": start, "end": end,
                                "version": version})
            self.stats["load_s"] = max(self.stats["load_s"], end - start)

    # ------------------------------------------------------------------ metrics and state

    def step_metrics(self, step_seconds: float) -> dict[str, float]:
        """Per step: the lag histogram, drops, buffer depth, restarts, each worker's busy fraction and tokens/s."""
        m: dict[str, float] = {f"pipeline/lag_{k}": float(v) for k, v in sorted(self.lags.items())}
        m["pipeline/dropped_stale_groups"] = float(self.stats.pop("dropped_stale_groups", 0))
        m["pipeline/discarded_groups"] = float(self.stats.pop("discarded_groups", 0))
        m["pipeline/buffer_jobs"] = float(sum(len(v) for v in self.buffer.values()) + len(self.inflight) + len(self.queue))
        m["pipeline/restarts"] = float(self.restarts)
        self.loaded()
        m["pipeline/weight_load_s"] = float(self.stats.pop("load_s", 0.0))  # the slowest load finished this step
        for w in range(len(self.workers)):
            busy = self.stats.pop(f"busy_s/{w}", 0.0)
            tokens = self.stats.pop(f"tokens/{w}", 0)
            m[f"pipeline/worker{w}_busy"] = busy / max(step_seconds, 1e-9)
            m[f"pipeline/worker{w}_tokens_per_s"] = tokens / max(busy, 1e-9) if busy else 0.0
        self.lags.clear()
        return m

    def pending(self) -> dict[int, list[int]]:
        """Steps admitted ahead whose groups the learner has not taken (saved in checkpoints: a resumed
        run regenerates them with the checkpoint's weights)."""
        return {s: idx for s, idx in self.admitted.items() if s > self.version}

    def restore(self, pending: dict[int, list[int]], params: Callable[[int], SamplingParams]) -> None:
        """Admit again the steps a checkpoint had drawn ahead: their groups are regenerated with the
        checkpoint's weights (what was buffered or in flight when the learner stopped is not kept)."""
        for step in sorted(pending):
            self.admit_step(int(step), list(pending[step]), params(int(step)))
        if pending:
            self.warn(f"pipeline: regenerating the groups of {len(pending)} step(s) drawn ahead before the checkpoint")

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self.started_ray:
            ray.shutdown()


class StepFeed:
    """The `draw` and round rollout that the shared collect stage calls for one step when the groups
    come from the pipe: round 0 takes the step's groups admitted ahead (admitting them now if
    staleness did not allow it earlier); refill rounds are admitted ahead of every later step. With
    `pieces` each job's groups are handed over as it finishes, and `idle` runs while none is ready."""

    def __init__(self, pipe: RolloutPipe, step: int, draw: Callable[[int], Sequence[int]],
                 params: Callable[[int], SamplingParams], idle: Callable[[], bool] | None = None):
        self.pipe, self.step, self.draw_more, self.params, self.idle = pipe, step, draw, params, idle
        self.round = 0
        self.indices: list[int] = []
        self.max_lag = 0
        self.on_gpu = False

    def draw(self, k: int) -> list[int]:
        if self.round == 0:
            if self.step not in self.pipe.admitted:
                self.pipe.admit_step(self.step, list(self.draw_more(k)), self.params(self.step))
            self.indices = self.pipe.admitted.pop(self.step)
        else:
            self.indices = list(self.draw_more(k))
        return self.indices

    def begin_round(self, sampling: SamplingParams, group_offset: int) -> int:
        """The round collect starts now; a refill round's jobs are admitted here."""
        round_ = self.round
        self.round += 1
        if round_ > 0:
            self.pipe.admit(self.step, round_, self.indices, sampling, group_offset)
        return round_

    def whole(self, prompts: list[list[int]], examples: list[Any], sampling: SamplingParams,
              group_offset: int) -> Iterator[Batch]:
        """The round's groups in order, once all have arrived."""
        dones = self.pipe.take(self.step, self.begin_round(sampling, group_offset))
        self.seen(dones)
        yield concat([d.batch for d in dones], self.pipe.pad_id)

    def pieces(self, prompts: list[list[int]], examples: list[Any], sampling: SamplingParams,
               group_offset: int) -> Iterator[Batch]:
        """The round's groups, a finished job at a time (running `idle` while none is ready)."""
        for done in self.pipe.arrivals(self.step, self.begin_round(sampling, group_offset), self.idle):
            self.seen([done])
            yield done.batch

    def seen(self, dones: list[Done]) -> None:
        """Note the largest lag and whether a GPU generated (the step's metrics)."""
        for d in dones:
            self.max_lag = max(self.max_lag, self.pipe.version - d.version)
            self.on_gpu = self.on_gpu or d.device.startswith("cuda")


def check_pipeline(cfg: Config) -> None:
    """dist.rollout_workers > 0 needs Ray and one learner rank (one ConfigError line)."""
    import importlib.util

    from upslope.distributed import group

    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"dist.rollout_workers={cfg.dist.rollout_workers}: ray is not installed "
                          f"(pip install 'upslope[ray]')")
    if group.world() > 1:
        raise ConfigError("dist.rollout_workers > 0 with several learner ranks is not supported yet; "
                          "set dist.learner_procs=1")


class RayPipeline:
    """The Ray rollout workers as the run's batch source and weight sink. `next(step)` collects the
    step's groups (admitted ahead, later steps admitted as far as pipeline.max_staleness allows);
    `push` sends the weights to every worker and admits what the new version makes admissible. With
    a streamed update, each job's kept groups go to it on arrival, and while no job is ready the
    learner forwards what has arrived (timed as learner, not as rollout)."""

    streams = True

    def __init__(self, cfg: Config, task: Task, sampler: Any, rounds: Rounds, keep: Keep | None,
                 stop_ids: list[int], clock: StageClock, run_dir: Path, version: int,
                 warn: Callable[[str], None]):
        self.cfg, self.task, self.sampler, self.rounds, self.keep = cfg, task, sampler, rounds, keep
        self.stop_ids, self.clock, self.run_dir = stop_ids, clock, run_dir
        self.pipe = RolloutPipe(cfg, task, task.pad_id, version, warn=warn)
        self.push_seconds = 0.0
        self.last_seen: Batch | None = None

    def start(self) -> None:
        """Nothing: the workers' engines are up once the pipeline exists."""

    def params(self, step: int) -> SamplingParams:
        return step_sampling(self.cfg, self.stop_ids, step)

    def prefetch(self, version: int) -> None:
        """Admit every step that `version` (the learner's) allows, drawn now."""
        self.pipe.prefetch(min(self.cfg.train.steps, version + 1 + self.cfg.pipeline.max_staleness),
                           self.sampler.next, self.rounds.first, self.params)

    def next(self, step: int, stream: StreamedUpdate | None = None) -> Collected:
        self.push_seconds = 0.0  # this step's push happens after it collects
        self.prefetch(self.pipe.version)

        def idle() -> bool:
            if stream is None or not stream.pending:
                return False
            with self.clock("learner", pause="rollout"):
                return stream.work()

        feed = StepFeed(self.pipe, step, self.sampler.next, self.params, idle=idle)
        got = collect(self.task, feed.pieces if stream is not None else feed.whole, feed.draw, self.params(step),
                      step_rounds(self.rounds, self.cfg, step), self.keep, clock=self.clock,
                      on_kept=stream.add if stream is not None else None)
        got.metrics["pipeline/max_lag"] = float(feed.max_lag)
        got.metrics["rollout/engine_on_gpu"] = float(feed.on_gpu)  # the workers' engines
        self.last_seen = got.seen
        return got

    def push(self, weights: Weights, version: int) -> None:
        self.push_seconds = self.pipe.push(weights, version)
        self.prefetch(version)
        release_freed_memory()

    def step_metrics(self, clock: StageClock, step: int) -> dict[str, float]:
        """The pipeline's metrics of the step, and the step's learner spans on the run's timeline."""
        seconds = clock.seconds["step"]
        metrics = self.pipe.step_metrics(seconds)
        metrics["pipeline/weight_push_s"] = self.push_seconds
        metrics["pipeline/learner_busy"] = clock.seconds.get("learner", 0.0) / max(seconds, 1e-9)
        self.pipe.events.extend({"who": "learner" if stage != "rollout" else "learner_wait", "start": t0,
                                 "end": t1, "step": step} for stage, t0, t1 in clock.spans
                                if stage in ("learner", "sync", "rollout"))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Steps drawn ahead: regenerated with the checkpoint's weights on resume."""
        return {"pipeline": self.pipe.pending()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pipe.restore(state.get("pipeline") or {}, self.params)

    def close(self) -> None:
        import json

        with open(self.run_dir / "timeline.jsonl", "w") as f:  # who was busy when (benchmarks/async_timeline.py)
            f.writelines(json.dumps(e) + "\n" for e in self.pipe.events)
        self.pipe.close()
