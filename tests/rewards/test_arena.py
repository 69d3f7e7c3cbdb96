"""Reasoning Arena: the Bradley-Terry fit and the relative reward by hand."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.registry import REWARDS
from upslope.rewards.arena import closeness_judge, fit_bradley_terry


def test_bradley_terry_fit_by_hand():
    """Two items, i wins 3 of 4: the maximum-likelihood strength gap is logit(0.75) = ln 3, mean 0."""
    s = fit_bradley_terry(torch.tensor([[0.0, 0.75], [0.25, 0.0]]))
    assert s.tolist() == pytest.approx([math.log(3) / 2, -math.log(3) / 2], abs=1e-5)
    # ridge l2: the stationary point of  -[0.75 log sig(2d) + 0.25 log sig(-2d)] + l2 d^2  is sig(2d) = 0.75 - l2 d
    d = float(fit_bradley_terry(torch.tensor([[0.0, 0.75], [0.25, 0.0]]), l2=0.5)[0])
    assert 1 / (1 + math.exp(-2 * d)) == pytest.approx(0.75 - 0.5 * d, abs=1e-5)


def test_closeness_judge():
    assert closeness_judge("51", "60", 50) == 1.0 and closeness_judge("60", "51", 50) == 0.0
    assert closeness_judge("49", "51", 50) == 0.5 and closeness_judge("no", "99", 50) == 0.0


def test_arena_reward_only_moves_zero_variance_groups():
    """Group a (all wrong, answer 50): "51" and "60" against anchors 51, 60, 150 win 2.5 and 1.5 of 3, so the
    first gets a positive relative reward and the second its negative; group b (mixed) keeps 1 / 0."""
    fn = REWARDS.bind("arena", {"coef": 0.5})
    metas = [{"example_id": "a"}, {"example_id": "a"}, {"example_id": "b"}, {"example_id": "b"}]
    out = fn(["51", "60", "7", "8"], [50, 50, 7, 7], metas)
    assert out[0] > 0 and out[1] == pytest.approx(-out[0]) and out[0] < 0.5
    assert out[2:] == [1.0, 0.0]
    right = fn(["50", "50 apples"], [50, 50], [{"example_id": "c"}] * 2)
    assert right == pytest.approx([1.0, 1.0])  # all right and equally close: no relative difference
