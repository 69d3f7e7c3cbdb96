"""TD-Grokking: problems on which every sample failed are decomposed into verifiable
subproblems, trained in the next draw of prompts. The subproblems are added to the training prompts once,
at set-up (the sampler's `extend` hook), so the collect stage, the sampler's feedback, checkpoints and the
Ray rollout workers see ordinary prompts of the task."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from upslope.bounds import Fraction, PositiveCount
from upslope.data.samplers import UniformSampler
from upslope.data.sources import apply_template
from upslope.data.types import Example
from upslope.errors import ConfigError
from upslope.registry import SAMPLERS, TASKS

if TYPE_CHECKING:
    from upslope.config import DataConfig

Problem = tuple[int, str, int]


def arith_steps(a: int, op: str, b: int) -> list[Problem]:
    """One level of decomposition of `a op b`: for + with two operands of 2+ digits, the ones digits' sum, the
    tens' sum and their recombination (10 x tens sum + ones sum, where the carry happens); for * with an operand
    of 2+ digits, a times each digit of the longer one and the recombination; [] when already elementary."""
    if op == "+" and min(a, b) >= 10:
        return [(a % 10, "+", b % 10), (a // 10, "+", b // 10), (10 * (a // 10 + b // 10), "+", a % 10 + b % 10)]
    if op == "*" and max(a, b) >= 10:
        a, b = (a, b) if b >= 10 else (b, a)
        return [(a, "*", b % 10), (a, "*", b // 10), (10 * a * (b // 10), "+", a * (b % 10))]
    return []


def problem(ex: Example) -> Problem | None:
    """The (a, op, b) of an arith example, None for any other."""
    m = ex.meta
    return (m["a"], m["op"], m["b"]) if isinstance(m.get("a"), int) and isinstance(m.get("b"), int) else None


def td_subproblems(examples: Sequence[Example], data: DataConfig, *, depth: int = 1, **_: Any) -> list[Example]:
    """The distinct subproblems, down to `depth` levels, of every training problem that is not one already:
    prompts in the task's own format, the answer computed, meta["td_level"] their level."""
    if data.path or data.task != "arith":
        raise ConfigError(f"data.sampler td_grokking: no decomposition for task '{data.path or data.task}' "
                          f"(built in: arith)")
    if depth < 1:
        raise ConfigError(f"data.sampler.options.depth: must be at least 1 (got {depth})")
    fmt = data.options.get("prompt", TASKS.get("arith").options()["prompt"].default)
    seen = dict.fromkeys(problem(ex) for ex in examples)  # ordered: the same prompts in the same order every run
    frontier, out = [p for p in seen if p], []
    for level in range(1, depth + 1):
        new = []
        for s in (s for p in frontier for s in arith_steps(*p)):
            if s not in seen:
                seen[s] = None
                new.append(s)
        out += [Example(prompt=apply_template(data.template, fmt.format(a=a, op=op, b=b), {}, "td_grokking"),
                        answer=a + b if op == "+" else a * b, id=f"td-{a}{op}{b}",
                        meta={"a": a, "b": b, "op": op, "td_level": level, "metrics": {"td/subproblem": 1.0}})
                for a, op, b in new]
        frontier = new
    return out


@SAMPLERS.register("td_grokking", extend=td_subproblems)
class TDGrokkingSampler(UniformSampler):
    """TD-Grokking: a problem whose whole group failed gets its verifiable subproblems queued, and they fill
    up to `share` of the following draws; the rest are the task's own problems in uniform epochs.

    share: largest fraction of a draw given to queued subproblems
    depth: levels of decomposition added to the prompts (a failed subproblem queues its own subproblems)
    threshold: a sample succeeds when its reward is at least this

    The paper decomposes with a model and recursively; here the task decomposes by rule (arith: ones, tens and
    the carrying recombination; one-digit products are elementary, so the default task gets none). Queued in
    the next draw rather than the same step, so a step's groups stay one per drawn prompt. The queue is saved
    in checkpoints with the sampler.
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, examples: Sequence[Example] = (), *,
                 share: Fraction = 0.5, depth: PositiveCount = 1, threshold: float = 0.5):
        where = {problem(ex): i for i, ex in reversed(list(enumerate(examples)))}
        self.children = [[where[s] for s in arith_steps(*p) if s in where] if (p := problem(ex)) else []
                         for ex in examples]
        self.roots = [i for i, ex in enumerate(examples) if "td_level" not in ex.meta] or list(range(num_prompts))
        super().__init__(len(self.roots), seed, shuffle)
        self.share, self.threshold = share, threshold
        self.queue: list[int] = []

    def next(self, count: int) -> list[int]:
        take = self.queue[:min(len(self.queue), round(self.share * count))]
        self.queue = self.queue[len(take):]
        return take + [self.roots[i] for i in super().next(count - len(take))]

    def update(self, indices: list[int], rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
        """Queue the subproblems of every prompt whose group failed on every sample (group id g is indices[g])."""
        for g in group_ids.unique().tolist():
            if bool((rewards[group_ids == g] < self.threshold).all()) and indices[g] < len(self.children):
                self.queue += [c for c in self.children[indices[g]] if c not in self.queue]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "queue": list(self.queue)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.queue = list(state["queue"])
