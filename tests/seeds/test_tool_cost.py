"""Translate-R1's confidence-gated tool cost against a hand computation: a tool call costs only in a group
whose unaided samples show the policy can answer without it."""
from __future__ import annotations

import pytest
import torch

from upslope.algos.combiners import confidence_gated_cost
from upslope.errors import ConfigError


def test_the_cost_applies_only_where_the_policy_is_confident_unaided():
    # group 0: unaided samples 0, 1, 2 all right (rate 1) -> the tool call of sample 3 costs 0.3
    # group 1: unaided samples 4, 5 right and wrong (rate 0.5 >= 0.5) -> sample 6's call costs
    # group 2: unaided sample 7 alone (< min_native 2) -> sample 8's call is free
    # group 3: unaided samples 9, 10 both wrong -> the calls of 11 are free
    correct = torch.tensor([1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 1], dtype=torch.float32)
    tool = torch.tensor([0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1], dtype=torch.float32)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3])
    got = confidence_gated_cost({"env/correct": correct, "env/tool": tool}, groups, correct="env/correct",
                                tool="env/tool", cost=0.3, threshold=0.5, min_native=2)
    want = correct.clone()
    want[3] -= 0.3
    want[6] -= 0.3
    assert torch.allclose(got, want)
    # the tool indicator is never summed, whatever its weight; other components keep their weights
    fmt = torch.ones(12)
    got = confidence_gated_cost({"env/correct": correct, "env/tool": tool, "fmt": fmt}, groups,
                                weights={"env/tool": 5.0, "fmt": 0.5}, correct="env/correct", tool="env/tool")
    assert torch.allclose(got, want + 0.5)


def test_missing_components_are_one_line():
    with pytest.raises(ConfigError, match="no reward component 'tool'"):
        confidence_gated_cost({"correct": torch.ones(2)}, torch.zeros(2, dtype=torch.long))
