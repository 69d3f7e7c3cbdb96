"""The decisions of successive halving (upslope/sweep/halving.py) on hand-computed cases and as
properties: rung sizes, the configurations drawn, who is promoted, the steps a sweep trains."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.sweep.halving import (promoted, ranked, rung_sizes, sample_points, steps_trained, trend_slope,
                                   trend_verdict)
from upslope.sweep.spec import Range


def test_rung_sizes_by_hand():
    assert rung_sizes(8, 2, 3) == [8, 4, 2]
    assert rung_sizes(9, 3, 3) == [9, 3, 1]
    assert rung_sizes(2, 3, 3) == [2, 1, 1]  # at least one trial goes on
    assert rung_sizes(5, 2, 1) == [5]


def test_points_are_the_grid_or_a_seeded_draw():
    space = {"optim.lr": [1e-6, 1e-5], "rollout.n": [4, 8]}
    assert sample_points(space, 8, seed=0) == [{"optim.lr": 1e-6, "rollout.n": 4}, {"optim.lr": 1e-6, "rollout.n": 8},
                                               {"optim.lr": 1e-5, "rollout.n": 4}, {"optim.lr": 1e-5, "rollout.n": 8}]
    drawn = sample_points(space, 3, seed=1)
    assert len(drawn) == 3 and len({tuple(p.values()) for p in drawn}) == 3  # distinct grid points
    assert drawn == sample_points(space, 3, seed=1) and drawn != sample_points(space, 3, seed=2)
    ranged = sample_points({"optim.lr": Range(log_uniform=(1e-6, 1e-4)), "rollout.n": [4, 8]}, 5, seed=0)
    assert len(ranged) == 5 and all(1e-6 <= p["optim.lr"] <= 1e-4 and p["rollout.n"] in (4, 8) for p in ranged)
    ints = sample_points({"rollout.n": Range(int_uniform=(2, 3))}, 20, seed=0)
    assert {p["rollout.n"] for p in ints} == {2, 3}


def test_promotion_by_hand():
    scores = {"t000": 0.5, "t001": 0.7, "t002": None, "t003": 0.7, "t004": 0.1}
    assert ranked(scores, "max") == ["t001", "t003", "t000", "t004"]  # a tie goes to the earlier trial
    assert ranked(scores, "min") == ["t004", "t000", "t001", "t003"]
    assert promoted(scores, 2, "max") == ["t001", "t003"]
    assert promoted({"t000": 0.2, "t001": None}, 2, "max") == ["t000"]  # a failed trial never goes on
    assert promoted({"t000": float("nan"), "t001": 0.0}, 1, "max") == ["t001"]
    # rungs 10, 20, 40: trials stopped at rungs 0, 0, 1 and one reaching 2 train 10 + 10 + 20 + 40 steps
    assert steps_trained([10, 20, 40], [0, 0, 1, 2, -1]) == 80


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.sampled_from([f"t{i:03d}" for i in range(10)]),
                       st.one_of(st.none(), st.floats(-5, 5)), min_size=1), st.integers(1, 10),
       st.sampled_from(["max", "min"]))
def test_promoted_are_the_best_scored(scores, keep, goal):
    chosen = promoted(scores, keep, goal)
    valid = [t for t, v in scores.items() if v is not None and not math.isnan(v)]
    assert len(chosen) == min(keep, len(valid)) and chosen == sorted(chosen) and set(chosen) <= set(valid)
    sign = 1 if goal == "max" else -1
    for t in chosen:
        assert all(sign * scores[t] >= sign * scores[o] for o in valid if o not in chosen)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 64), st.integers(2, 5), st.integers(1, 5))
def test_rung_sizes_shrink_by_eta(trials, eta, rungs):
    sizes = rung_sizes(trials, eta, rungs)
    assert len(sizes) == rungs and sizes[0] == trials
    assert all(b == max(1, a // eta) for a, b in zip(sizes, sizes[1:]))


def test_trend_verdict_by_hand():
    # slope of (1, 0.1), (2, 0.3), (3, 0.2): x mean 2, y mean 0.2, sum (x - 2)(y - 0.2) = 0.1 + 0 + 0 = 0.1, sxx = 2
    assert math.isclose(trend_slope([(1, 0.1), (2, 0.3), (3, 0.2)]), 0.05)
    assert trend_slope([(4, 1.0)]) == 0.0 and trend_slope([(2, 1.0), (2, 3.0)]) == 0.0
    rising = [(1, 0.0), (2, 0.1), (3, 0.2), (4, 0.3)]
    assert trend_verdict(rising, window=3, min_slope=0.0, drop=0.5, goal="max") is None
    assert trend_verdict(rising, window=3, min_slope=0.1, drop=0.5, goal="max") == "flat: slope 0.1/step over 3 steps"
    assert trend_verdict(rising, window=5, min_slope=0.1, drop=0.5, goal="max") is None  # too few points
    assert trend_verdict(rising, window=3, min_slope=0.0, drop=0.5, goal="min") == "flat: slope 0.1/step over 3 steps"
    # the last 3 of 0.9, 0.8, 0.2 (steps 2-4): best 0.9, latest 0.2, fell 0.7 > 0.5
    fell = [(1, 0.0), (2, 0.9), (3, 0.8), (4, 0.2)]
    assert trend_verdict(fell, window=3, min_slope=-1.0, drop=0.5, goal="max") == "collapsing: 0.7 below the window's best"
    assert trend_verdict(fell, window=3, min_slope=-1.0, drop=0.75, goal="max") is None  # slope -0.35 > -1
    # for a metric that should go down (a loss), a rise is the collapse
    loss = [(1, 2.0), (2, 1.0), (3, 1.8)]
    assert trend_verdict(loss, window=3, min_slope=-1.0, drop=0.5, goal="min") == "collapsing: 0.8 below the window's best"
