"""OPT* on knapsack: the exact optimum, the feasibility checker and the evaluator by hand, the complexity knob,
and the rank-based shaping advantage against a hand-ranked group."""
from __future__ import annotations

import itertools

import pytest
import torch

from upslope.algos.advantages import group_rank
from upslope.batch import build_batch
from upslope.data.optimization import best_value, knapsack as knapsack_task
from upslope.rewards.optimization import feasible, knapsack, plan

META = {"weights": [3, 4, 5, 2], "values": [4, 5, 6, 3], "capacity": 7}


def test_best_value_is_the_brute_force_optimum():
    assert best_value(META["weights"], META["values"], 7) == 9  # items 1 + 2 or 3 + 4: weight 7, value 9
    for ex in knapsack_task(items=5, count=30):
        w, v, c = ex.meta["weights"], ex.meta["values"], ex.meta["capacity"]
        brute = max(sum(v[k] for k in s) for n in range(6) for s in itertools.combinations(range(5), n)
                    if sum(w[k] for k in s) <= c)
        assert ex.answer == brute


def test_checker_and_evaluator_by_hand():
    assert plan(" 1, 2\nbecause ...") == [1, 2]
    assert feasible([1, 2], META["weights"], 7) and not feasible([1, 3], META["weights"], 7)  # weight 8 > 7
    assert not feasible([1, 1], META["weights"], 7) and not feasible([5], META["weights"], 7)  # twice; no item 5
    assert knapsack(" 1, 2", 9, META) == 1.0
    assert knapsack(" 3, 4", 9, META) == pytest.approx(9 / 9)  # weight 7, value 9: another optimum
    assert knapsack(" 2, 4", 9, META) == pytest.approx(8 / 9)
    assert knapsack(" 2, 4", 9, META, exact=True) == 0.0
    assert knapsack(" 1, 3", 9, META, infeasible=-0.5) == -0.5
    assert knapsack(" none", 9, META) == 0.0


def test_the_complexity_knob_and_the_split():
    small, large = knapsack_task(items=3, count=5), knapsack_task(items=8, count=5)
    assert all(len(e.meta["weights"]) == 3 for e in small) and all(len(e.meta["weights"]) == 8 for e in large)
    assert "8: " in large[0].prompt and "4: " not in small[0].prompt
    train, test = knapsack_task(count=20), knapsack_task(split="test", count=20)
    assert [e.prompt for e in train] != [e.prompt for e in test]
    assert [e.prompt for e in knapsack_task(count=20)] == [e.prompt for e in train]


def test_rank_shaping_by_hand():
    """A group of four rewards 0.9, 0.2, 0.5, 0.5 ranks 3, 0, 1.5, 1.5 of 3: +1, -1, 0, 0; a tied group 0."""
    b = build_batch(prompt_ids=[[7]] * 6, completion_ids=[[5]] * 6, completion_logprobs=[[-0.5]] * 6,
                    group_ids=[0, 0, 0, 0, 1, 1], truncated=[False] * 6, pad_id=0)
    b.rewards = torch.tensor([0.9, 0.2, 0.5, 0.5, 0.3, 0.3])
    adv = group_rank(b)[:, 1]
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    b.rewards = torch.tensor([0.9, 0.89, 0.1, 0.0, 1.0, 0.0])  # close values still a full rank apart
    assert group_rank(b)[:, 1].tolist() == pytest.approx([1.0, 1 / 3, -1 / 3, -1.0, 1.0, -1.0])
