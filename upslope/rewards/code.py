"""The `code` reward: run the program in a completion against the sample's tests, sandboxed.

Two kinds of tests, read from the sample's meta:
- function tests (HumanEval style): `test` (code; with `entry_point` it defines
  `check(candidate)`, without it is plain asserts) and optional `code_prefix` (the prompt's
  signature and docstring, so a completion that gives only the body still runs). The
  program (prefix + completion) runs in the sandbox as module `solution`; the tests run in
  a checker process outside it and call the program's functions through a proxy, so only
  plain data crosses and the test code never runs beside the program
  (upslope.sandbox.functest). It passes when every test ran without an exception.
- stdin/stdout cases: `cases: [{"stdin": ..., "stdout": ...}, ...]`; one run per case, the
  output compared outside the sandbox, line by line with trailing whitespace ignored.

`meta["timeout_s"]`, when present, overrides the time limit for that sample. Each
sample's meta gets `sandbox_status` (ok, failed, syntax_error, timeout, memory,
output_limit, crashed), `tests_passed` and `tests_total`.
"""

import os
import re
import threading
from typing import Any, Literal

from upslope.bounds import Positive, PositiveCount
from upslope.errors import ConfigError, DataError, SetupError
from upslope.registry import REWARDS
from upslope.sandbox import FunctionTest, Job, Result, SandboxConfig, SandboxPool, Status

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.#-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.M | re.S)
_PYTHON_TAGS = {"python", "py", "python3", "py3", ""}
_SYNTAX = re.compile(r"^(SyntaxError|IndentationError|TabError)\b", re.M)
# Worst first: the status a sample reports when its runs ended differently.
_PRIORITY = ["refused", "syntax_error", "memory", "timeout", "output_limit", "crashed", "failed", "ok"]
# How the sandbox ended a run, when it ended it: these outrank the checker's view.
_SANDBOX_ENDED = (Status.TIMEOUT, Status.MEMORY, Status.OUTPUT_LIMIT, Status.CRASHED, Status.REFUSED)


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The program in a completion: the last fenced Python (or untagged) block that defines
    `entry_point` if given, else the last such block; the whole text when there is no
    fence. An unclosed fence (a cut-off generation) runs to the end of the text."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    if not blocks:
        return completion
    cands = [body for tag, body in blocks if tag in _PYTHON_TAGS] or [body for _, body in blocks]
    if entry_point:
        defining = [b for b in cands if _defines(b, entry_point)]
        if defining:
            return defining[-1]
    return cands[-1]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def solution_program(code: str, meta: dict[str, Any]) -> str:
    """prefix + completion: the program whose functions the tests call (the tests stay outside)."""
    prefix = str(meta.get("code_prefix") or "")
    entry = meta.get("entry_point")
    if prefix and not prefix.endswith("\n"):
        prefix += "\n"
    if entry and _defines(code, str(entry)):
        return prefix + "\n\n" + code  # a whole function: it replaces the prompt's stub
    return prefix + code  # the body of the prompt's function (or a whole program)


def function_test(meta: dict[str, Any]) -> FunctionTest:
    """The sample's tests, as the checker outside the sandbox runs them."""
    entry = meta.get("entry_point")
    return FunctionTest(test=str(meta["test"]), entry_point=str(entry) if entry else None,
                        prefix=str(meta.get("code_prefix") or ""))


def _same_output(got: str, want: str) -> bool:
    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip().splitlines()]

    return norm(got) == norm(want)


def _status(res: Result) -> str:
    if res.verdict is not None:
        if res.verdict.passed:
            return "ok"
        if res.status in _SANDBOX_ENDED:
            return str(res.status)
        return res.verdict.kind if res.verdict.kind in ("syntax_error", "timeout", "memory") else "failed"
    if res.status is Status.FAILED and _SYNTAX.search(res.stderr[-2000:]):
        return "syntax_error"
    return str(res.status)


_POOLS: dict[tuple[SandboxConfig, int | None, int], SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(config: SandboxConfig, workers: int | None = None) -> SandboxPool:
    """The process-wide pool for this config (made once, reused across reward calls; a
    forked child makes its own, since the parent's worker threads do not survive a fork)."""
    key = (config, workers, os.getpid())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = SandboxPool(config, workers)
    return pool


@REWARDS.register("code", batched=True)
def code(
    completions: list[str],
    answers: list[Any],
    metas: list[dict],
    *,
    mode: Literal["all_pass", "fraction"] = "all_pass",
    timeout_s: Positive = 10.0,
    memory_mb: PositiveCount = 1024,
    allow_weak: bool = False,
    workers: int | None = None,
    batch_timeout_s: float | None = None,
) -> list[float]:
    """Run the completion's program against the sample's tests in the sandbox: 1/0 when all pass, or the fraction passed.

    mode: "all_pass" (1 if every test passes, else 0) or "fraction" (share of tests passed)
    timeout_s: wall-clock limit of each run in seconds (a sample's meta timeout_s overrides it)
    memory_mb: address-space limit of each process in MiB (RLIMIT_AS)
    allow_weak: without bubblewrap run with rlimits only (weak isolation) instead of refusing
    workers: programs run at once (null: one per CPU core)
    batch_timeout_s: deadline of a whole batch in seconds (null: longest limit + 0.25 s per job per worker)
    """
    if mode not in ("all_pass", "fraction"):
        raise ConfigError(f"reward 'code': mode must be 'all_pass' or 'fraction', got {mode!r}")
    jobs: list[Job] = []
    plans: list[tuple[int, int, list[Any]]] = []  # per sample: first job, job count, expected outputs
    for i, (completion, meta) in enumerate(zip(completions, metas)):
        limit = meta.get("timeout_s")
        limit = float(limit) if limit is not None else None
        first = len(jobs)
        if meta.get("cases") is not None:
            cases = meta["cases"]
            if not isinstance(cases, list) or not cases:
                raise DataError(f"reward 'code': sample {i}: meta['cases'] must be a non-empty list")
            program = extract_code(completion)
            expected = []
            for case in cases:
                if not isinstance(case, dict):
                    raise DataError(f"reward 'code': sample {i}: each case needs 'stdin' and 'stdout'")
                stdin = case.get("stdin", case.get("input", ""))
                expected.append(str(case.get("stdout", case.get("output", ""))))
                jobs.append(Job(code=program, stdin=str(stdin), timeout_s=limit))
            plans.append((first, len(cases), expected))
        elif meta.get("test") is not None:
            program = solution_program(extract_code(completion, meta.get("entry_point")), meta)
            jobs.append(Job(code=program, check=function_test(meta), timeout_s=limit))
            plans.append((first, 1, [None]))
        else:
            raise DataError(
                f"reward 'code': sample {i}: meta needs 'test' (with 'entry_point' for a check() "
                "function) or 'cases' (a list of {'stdin', 'stdout'})"
            )

    config = SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb, allow_weak=allow_weak, batch_timeout_s=batch_timeout_s)
    pool = get_pool(config, workers)
    if pool.problem:
        raise SetupError(f"reward 'code': {pool.problem}")
    results = pool.run_many(jobs)
    rewards: list[float] = []
    for (first, count, expected), meta in zip(plans, metas):
        runs = results[first : first + count]
        is_cases = meta.get("cases") is not None
        passed = 0
        statuses = []
        for res, want in zip(runs, expected):
            status = _status(res)
            if is_cases:
                ok = res.status is Status.OK and _same_output(res.stdout, want)
            else:
                ok = res.verdict is not None and res.verdict.passed  # the checker's, never the program's word
            if status == "refused":
                raise SetupError(f"reward 'code': {res.error}")
            passed += ok
            statuses.append(status)
        meta["sandbox_status"] = min(statuses, key=_PRIORITY.index)
        meta["tests_passed"] = passed
        meta["tests_total"] = count
        if mode == "fraction":
            rewards.append(passed / count)
        else:
            rewards.append(1.0 if passed == count else 0.0)
    return rewards
