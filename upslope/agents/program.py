"""Agent programs: ordinary code that talks to the policy through an OpenAI-compatible base URL.

A program is a Python function `agent(base_url, row)` (plain or `async def`) or a shell command. It gets
the base URL of its own endpoint and the task row (the example's fields: prompt, answer, id and the
rest), does whatever it does (calls the model, runs tools, loops), and returns its reward: a number, a
dict of named reward parts, or None to leave the scoring to the run's reward functions. A command gets
the base URL in OPENAI_BASE_URL (and UPSLOPE_BASE_URL), a placeholder OPENAI_API_KEY, the row as JSON
on stdin, and prints its reward as JSON on its last line of output."""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import shlex
import subprocess
from typing import Any, Callable

from upslope.data.types import Example
from upslope.errors import ConfigError

Reward = dict[str, float] | None


class ProgramFailed(Exception):
    """The agent program raised, exited with an error or printed no reward."""


def task_row(example: Example) -> dict[str, Any]:
    """What a program gets about its task: the example's fields, as a dataset row would have them."""
    return {**example.meta, "id": example.id, "prompt": example.prompt, "answer": example.answer}


def as_reward(value: Any) -> Reward:
    """A program's return value as reward parts: a number is the part `correct`, a dict names its parts,
    None leaves the scoring to the reward functions."""
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return {"correct": float(value)}
    if isinstance(value, dict) and all(isinstance(v, (int, float, bool)) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise ProgramFailed(f"the agent returned {type(value).__name__} {str(value)[:80]!r}; expected a number, "
                        "a dict of numbers, or None")


class FunctionProgram:
    """An agent program that is a Python function (base_url, row) -> reward."""

    def __init__(self, fn: Callable[..., Any], name: str):
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        if len(params) != 2:
            raise ConfigError(f"rollout.options.agent '{name}': the agent function takes (base_url, row); it has "
                              f"{len(params)} required positional parameters")
        self.fn, self.name = fn, name

    def __call__(self, base_url: str, row: dict[str, Any]) -> Reward:
        try:
            out = self.fn(base_url, row)
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
        except Exception as exc:
            raise ProgramFailed(f"{type(exc).__name__}: {exc}") from exc
        return as_reward(out)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class CommandProgram:
    """An agent program that is a shell command: base URL in the environment, row on stdin, reward printed
    as JSON on its last line. timeout_s: wall-clock limit of one run."""

    def __init__(self, command: str, timeout_s: float):
        if not shlex.split(command):
            raise ConfigError("rollout.options.command: empty command")
        self.command, self.timeout_s = command, timeout_s

    def __call__(self, base_url: str, row: dict[str, Any]) -> Reward:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "UPSLOPE_BASE_URL": base_url,
               "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "upslope")}
        try:
            done = subprocess.run(self.command, shell=True, input=json.dumps(row, default=str), env=env,
                                  capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise ProgramFailed(f"the agent command ran past {self.timeout_s:g} s (rollout.options.timeout_s)") from None
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output on stderr)"])[-1]
            raise ProgramFailed(f"the agent command exited with status {done.returncode}: {tail}")
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        if not lines:
            raise ProgramFailed("the agent command printed nothing; its last line of output is its reward as JSON "
                                "(a number, an object of numbers, or null)")
        try:
            value = json.loads(lines[-1])
        except json.JSONDecodeError:
            raise ProgramFailed(f"the agent command's last line is not JSON: {lines[-1][:80]!r}") from None
        return as_reward(value)
