"""The records of the sandbox: its limits, a job to run, and the result of a run."""
from __future__ import annotations

import enum
import os
import sys
from dataclasses import dataclass, field

from upslope.sandbox.functest import SOLUTION_NAME, FunctionTest, Verdict


class Status(str, enum.Enum):
    """How a run ended. A `str` subclass: `result.status == "ok"` works."""

    OK = "ok"  # exit code 0
    FAILED = "failed"  # a nonzero exit code (an uncaught exception, a failed assert, ...)
    TIMEOUT = "timeout"  # past the wall-clock, CPU-time or batch limit; the whole tree was killed
    MEMORY = "memory"  # ran out of its memory limit (MemoryError, ENOMEM, bad_alloc, the run's cgroup)
    OUTPUT_LIMIT = "output_limit"  # wrote more than max_output_bytes to stdout or stderr; killed
    CRASHED = "crashed"  # killed by a signal of its own (SIGSEGV from deep recursion, SIGABRT, ...)
    REFUSED = "refused"  # not run: no working bubblewrap and the weaker mode not allowed

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one run (and of a batch: batch_timeout_s). Every run has its own."""

    timeout_s: float = 10.0  # wall-clock limit; past it the whole process tree is killed
    cpu_s: float | None = None  # CPU-time limit (RLIMIT_CPU); None: the same as timeout_s
    memory_mb: int = 1024  # address-space limit of each process (RLIMIT_AS), MiB
    max_output_bytes: int = 1 << 20  # cap on stdout and on stderr each; past it the run is killed
    max_procs: int = 32  # processes and threads the program may have at once
    disk_mb: int = 64  # size of the writable /tmp (work dir included) and /dev/shm; largest file
    max_open_files: int = 256  # open file descriptors per process (RLIMIT_NOFILE)
    run_memory_mb: int | None = None  # memory of the whole run, all processes and its tmpfs (None: 2 x memory_mb)
    max_inodes: int = 4096  # files and directories the run's /tmp and /dev/shm may hold (as root)
    batch_timeout_s: float | None = None  # a whole batch's deadline (None: timeout_s + 0.25 s per job per worker)
    allow_weak: bool = False  # without bubblewrap, run with rlimits only instead of refusing
    python: str = sys.executable  # interpreter for Python jobs (its install is made visible)
    python_args: tuple[str, ...] = ()  # extra interpreter flags, e.g. ("-S",) for a faster start

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_output_bytes", "max_procs", "disk_mb", "max_open_files", "max_inodes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("cpu_s", "run_memory_mb", "batch_timeout_s"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0 or None, got {getattr(self, name)!r}")

    @property
    def run_memory_bytes(self) -> int:
        """The memory limit of the whole run (all its processes and its tmpfs)."""
        return (self.run_memory_mb if self.run_memory_mb is not None else 2 * self.memory_mb) << 20

    def batch_deadline_s(self, jobs: int, workers: int, longest_s: float | None = None) -> float:
        """Seconds a batch of `jobs` on `workers` may take before what is left is killed: the
        longest job limit, plus 0.25 s per job queued on each worker (room for honest work)."""
        if self.batch_timeout_s is not None:
            return self.batch_timeout_s
        return (longest_s or self.timeout_s) + 0.25 * -(-jobs // max(1, workers))


@dataclass
class Job:
    """One program to run: Python source (`code`) or a shell command line (`command`).

    `stdin` is fed to the program; `files` (relative name -> content) are put in the work
    directory beside it; `env` adds variables to the minimal environment; `timeout_s`
    overrides the config's wall-clock and CPU limits for this job. With `check` (a
    FunctionTest), `code` is loaded as module `solution` and its functions are tested from
    a checker process outside the sandbox; the Result then carries the checker's verdict.
    """

    code: str | None = None
    command: str | None = None
    stdin: str | bytes | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    check: FunctionTest | None = None

    def __post_init__(self) -> None:
        if (self.code is None) == (self.command is None):
            raise ValueError("a sandbox Job needs exactly one of code= (Python) or command= (shell)")
        if self.check is not None and (self.code is None or self.stdin is not None):
            raise ValueError("a sandbox Job with check= needs code= and no stdin=")
        for name in self.files:
            parts = name.split("/")
            if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"sandbox Job file name must be a plain relative path, got {name!r}")
            if name == PROGRAM_NAME and self.code is not None or name == SOLUTION_NAME and self.check is not None:
                raise ValueError(f"sandbox Job file name {name!r} is taken by the program")


PROGRAM_NAME = "main.py"


@dataclass
class Result:
    """The outcome of one run. `exit_code` is set when the program exited, `signal` when a
    signal ended it; stdout/stderr are decoded as UTF-8 (bad bytes replaced) and capped."""

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    truncated: bool = False  # stdout or stderr was cut at max_output_bytes
    error: str = ""  # why the run was refused, or what the sandbox itself reported
    mode: str = ""  # "bwrap" or "weak" (how it was isolated); "" when refused
    verdict: Verdict | None = None  # with Job.check: what the checker outside the sandbox decided
    limits: str = ""  # how the run's memory and processes were limited: "cgroup v1", "cgroup v2" or "rlimit"

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


def default_workers() -> int:
    """The number of CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
