"""OPT*'s checker and evaluator for the `knapsack` task (upslope.data.optimization): a reply's plan is feasible
when it names existing items, each once, within the capacity; a feasible plan is worth its value over the
optimum."""
from __future__ import annotations

import re
from typing import Any

from upslope.registry import REWARDS


def plan(text: str) -> list[int]:
    """The item numbers of a reply: the integers on its first non-empty line."""
    line = next((x for x in text.strip().splitlines() if x.strip()), "")
    return [int(n) for n in re.findall(r"\d+", line)]


def feasible(items: list[int], weights: list[int], capacity: int) -> bool:
    """Every item exists and is named once, and their weights fit the capacity (an empty plan is feasible)."""
    return (all(1 <= k <= len(weights) for k in items) and len(set(items)) == len(items)
            and sum(weights[k - 1] for k in items) <= capacity)


@REWARDS.register("knapsack")
def knapsack(completion: str, answer: Any, meta: dict, *, infeasible: float = 0.0, exact: bool = False) -> float:
    """The value of the reply's plan over the optimal value (1: optimal) when the plan is feasible, else
    `infeasible` (a reply naming no item too); the plan is the item numbers on the reply's first line.

    infeasible: the reward of a plan that breaks a constraint
    exact: 1 for an optimal plan, 0 for any other feasible plan
    """
    items = plan(completion)
    if not items or not feasible(items, meta["weights"], meta["capacity"]):
        return infeasible
    ratio = sum(meta["values"][k - 1] for k in items) / max(int(answer), 1)
    return float(ratio >= 1.0) if exact else ratio
