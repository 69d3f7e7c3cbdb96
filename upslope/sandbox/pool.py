"""A bounded pool of sandbox runs: a batch API for the trainer, an async API for agents."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from upslope.sandbox.runner import Sandbox
from upslope.sandbox.types import Job, Result, SandboxConfig, default_workers


class SandboxPool:
    """Runs up to `workers` programs at once (default: one per CPU core).

    Each run is bounded by its own wall-clock limit, and a batch (`run_many`) by one
    deadline (`SandboxConfig.batch_deadline_s`): at the deadline what still runs is killed
    and what has not started is not run; both come back as `timeout`. So a batch of hung
    programs takes about one time limit, not jobs / workers of them.
    """

    def __init__(self, config: SandboxConfig | None = None, workers: int | None = None, *, weak: bool = False):
        self.sandbox = Sandbox(config, weak=weak)
        self.workers = int(workers or default_workers())
        if self.workers < 1:
            raise ValueError(f"SandboxPool needs workers >= 1, got {workers!r}")
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="upslope-sandbox")

    @property
    def config(self) -> SandboxConfig:
        return self.sandbox.config

    @property
    def problem(self) -> str | None:
        """Why runs are refused (no working bubblewrap and no weak mode), else None."""
        return self.sandbox.problem if not self.sandbox.mode else None

    def run(self, job: Job) -> Result:
        """Run one job through the pool and wait for it."""
        return self._executor.submit(self.sandbox.run, job).result()

    def run_many(self, jobs: Iterable[Job]) -> list[Result]:
        """Run the jobs in parallel under one deadline; results come back in the order of the jobs."""
        jobs = list(jobs)
        longest = max((j.timeout_s if j.timeout_s is not None else self.config.timeout_s for j in jobs), default=None)
        deadline = time.monotonic() + self.config.batch_deadline_s(len(jobs), self.workers, longest)
        return list(self._executor.map(lambda job: self.sandbox.run(job, deadline), jobs))

    async def run_async(self, job: Job) -> Result:
        """Run one job without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.sandbox.run, job)

    async def run_many_async(self, jobs: Iterable[Job]) -> list[Result]:
        """`run_many` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.run_many, list(jobs))

    def close(self) -> None:
        """Wait for the runs in flight and stop the workers."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
