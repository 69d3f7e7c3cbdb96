"""Many callers, one engine: single generation requests from concurrent trajectories (agent programs
behind the OpenAI-compatible server, or multi-turn trajectories that are not run in lockstep) are
gathered into batched `Engine.generate` calls by one worker thread, the only thread that touches the
engine. A request waits for no other trajectory's turn: the worker takes whatever is waiting as soon
as the engine is free (after a short gathering window, cut short once every open caller is waiting),
so a trajectory whose tool answers fast joins the next engine call, not the end of the turn."""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from upslope.engine import Completion, Engine, SamplingParams


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: "Future[Completion]"


def _sampling_key(params: SamplingParams) -> tuple[Any, ...]:
    """What requests must share to be generated in one engine call (their reply limits may differ)."""
    return (params.temperature, params.top_p, params.top_k, tuple(params.stop_token_ids))


def cut(completion: Completion, limit: int) -> Completion:
    """The completion cut to `limit` tokens (a longer one ends for length; its text is left to the caller)."""
    if len(completion.token_ids) <= limit:
        return completion
    return Completion(list(completion.token_ids[:limit]), list(completion.logprobs[:limit]), "", "length")


class GenerationQueue:
    """A worker thread that serves `submit(prompt, params)` futures with batched engine calls.

    max_batch: most requests per engine call; gather_s: how long the worker waits for more requests
    after the first before it calls the engine (cut short once every open caller is waiting); seed:
    the base seed of the engine calls, each of which gets its own (None: a random base). Callers that will submit repeatedly say so with
    `open_caller()` / `close_caller()`, so the worker knows when nobody else is coming."""

    def __init__(self, engine: Engine, *, max_batch: int = 256, gather_s: float = 0.02, seed: int | None = None):
        self.engine = engine
        self.max_batch, self.gather_s = max_batch, gather_s
        self.seed = seed if seed is not None else random.randrange(2**31)
        self._pending: list[_Request] = []
        self._cond = threading.Condition()
        self._open = 0
        self._closed = False
        self.engine_calls = 0
        self.generated = 0
        self.busy_s = 0.0  # time the engine spent generating
        self._thread = threading.Thread(target=self._serve, name="upslope-generation", daemon=True)
        self._thread.start()

    def open_caller(self) -> None:
        with self._cond:
            self._open += 1

    def close_caller(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[Completion]":
        """One completion of `prompt` (params.n is taken as 1)."""
        future: Future[Completion] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the generation queue is closed")
            self._pending.append(_Request(list(prompt), replace(params, n=1), future))
            self._cond.notify_all()
        return future

    def generate(self, prompt: list[int], params: SamplingParams) -> Completion:
        return self.submit(prompt, params).result()

    def close(self) -> None:
        """Stop the worker (requests still waiting fail)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        for req in self._pending:
            req.future.set_exception(RuntimeError("the generation queue closed before this request ran"))
        self._pending.clear()

    def _take(self) -> list[_Request] | None:
        """The next batch: requests with the first waiting one's sampling settings (None: closed)."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = time.monotonic() + self.gather_s
            while (len(self._pending) < min(self.max_batch, max(self._open, 1)) and not self._closed
                   and (left := deadline - time.monotonic()) > 0):
                self._cond.wait(left)
            key = _sampling_key(self._pending[0].params)
            batch = [r for r in self._pending if _sampling_key(r.params) == key][:self.max_batch]
            taken = {id(r) for r in batch}
            self._pending = [r for r in self._pending if id(r) not in taken]
            return batch

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            limit = max(r.params.max_new_tokens for r in batch)
            seed = (self.seed + 7919 * self.engine_calls) % 2**31
            params = replace(batch[0].params, n=1, max_new_tokens=limit, seed=seed)
            start = time.perf_counter()
            try:
                outs = self.engine.generate([r.prompt for r in batch], params)
            except BaseException as exc:  # every caller of this batch gets the engine's error
                for r in batch:
                    r.future.set_exception(exc)
                continue
            finally:
                self.busy_s += time.perf_counter() - start
                self.engine_calls += 1
            for r, [comp] in zip(batch, outs):
                comp = cut(comp, r.params.max_new_tokens)
                self.generated += len(comp.token_ids)
                r.future.set_result(comp)
