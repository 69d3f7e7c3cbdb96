"""OPT*-style optimisation tasks (Astorga et al. 2026, *Step-by-Step Optimization-like Reasoning in LLMs over
Expanding Search Spaces*): a problem with many feasible answers of different value, a feasibility checker and
an evaluator (the `knapsack` reward), and a complexity knob that widens the search space without new labels.

`knapsack`: seeded 0/1 knapsack instances; `items` is the complexity knob (2**items candidate plans). The
reference answer is the optimal value, found exactly by dynamic programming over the capacity.
"""
from __future__ import annotations

import random

from upslope.bounds import PositiveCount
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.registry import TASKS

_TEST_SEED_OFFSET = 1_000_003
QUESTION = ("A bag holds a total weight of at most {capacity}. Items (number: weight, value): {items}. "
            "Which items give the largest total value that fits? Answer with the item numbers only.")
# one worked example: without it the embedded 135M model copies the item list or names every item
EXAMPLE = QUESTION.format(capacity=5, items="1: 4, 3; 2: 2, 2; 3: 3, 4") + "\nAnswer: 2, 3\n\n"


def best_value(weights: list[int], values: list[int], capacity: int) -> int:
    """The optimal total value of a 0/1 knapsack (dynamic programming over the capacity)."""
    best = [0] * (capacity + 1)
    for w, v in zip(weights, values):
        for c in range(capacity, w - 1, -1):
            best[c] = max(best[c], best[c - w] + v)
    return best[capacity]


@TASKS.register("knapsack", reward="knapsack", max_new_tokens=24, splits=("train", "test"))
def knapsack(*, split: str = "train", items: PositiveCount = 4, max_weight: PositiveCount = 9,
             max_value: PositiveCount = 9, count: PositiveCount = 5000, seed: int = 0,
             prompt: str = EXAMPLE + QUESTION, prefill: str = "Answer:") -> list[Example]:
    """Seeded 0/1 knapsack problems: pick items whose weights fit the capacity, maximising their total value.
    The answer is the optimal value; meta holds weights, values and capacity for the checker.

    split: "train" or "test" (the test split uses a different seed)
    items: items per problem, the complexity knob (the search space is 2**items plans)
    max_weight: weights are drawn from 1..max_weight
    max_value: values are drawn from 1..max_value
    count: number of problems
    seed: random seed (the test split adds a fixed offset)
    prompt: format string with {capacity} and {items} ("1: 3, 7; 2: ..."); the default opens with one worked
    example
    prefill: text the reply starts with (empty: none)
    """
    if split not in ("train", "test"):
        raise DataError(f"data.split={split!r}: task 'knapsack' has only the splits train, test")
    rng = random.Random(seed + (_TEST_SEED_OFFSET if split == "test" else 0))
    out = []
    for i in range(count):
        weights = [rng.randint(1, max_weight) for _ in range(items)]
        values = [rng.randint(1, max_value) for _ in range(items)]
        capacity = max(max(weights), sum(weights) // 2)  # about half the items fit: neither all nor none
        listed = "; ".join(f"{k + 1}: {w}, {v}" for k, (w, v) in enumerate(zip(weights, values)))
        out.append(Example(prompt=prompt.format(capacity=capacity, items=listed),
                           answer=best_value(weights, values, capacity),
                           meta={"weights": weights, "values": values, "capacity": capacity, "prefill": prefill},
                           id=f"knapsack-{split}-{i}", prefill=prefill))
    return out
