"""PUM against hand-computed cases: the measured prefixes of a tree rollout and their ranked sibling pairs, the
ranking fit's optimality condition, and each token's utility gain added to GRPO's outcome advantage."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.prefix_utility import fit_ranker, pum, ranked_pairs
from upslope.algos.tree import tree_nodes
from upslope.batch import build_batch
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def test_measured_prefixes_and_pairs_of_two_trees():
    """Rows 0, 1 pass node a (its segment ends after completion token 1) then leaves a0, a1; rows 2, 3 pass b, then
    b0, b1. Rewards 1, 1, 1, 0: a = 1, b = 0.5, a0 = a1 = b0 = 1, b1 = 0. Ranked siblings: (a, b), (b0, b1). A
    second prompt's two flat replies (rewards 0, 1) are siblings of each other only, never of a or b."""
    trees = [{"nodes": ["a", "a0"], "ends": [1]}, {"nodes": ["a", "a1"], "ends": [1]},
             {"nodes": ["b", "b0"], "ends": [1]}, {"nodes": ["b", "b1"], "ends": [1]}, {}, {}]
    b = build_batch([[7, 8]] * 6, [[5, 6, 9]] * 6, [[0.0] * 3] * 6, [0] * 4 + [1, 1], [False] * 6, pad_id=0,
                    meta=[{"tree": t} if t else {} for t in trees])
    nodes = tree_nodes(b, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0]))
    assert [n.name for n in nodes] == ["a", "a0", "a1", "b", "b0", "b1", "row4", "row5"]
    assert [(n.row, n.start, n.end) for n in nodes[:6]] == [(0, 0, 1), (0, 1, 3), (1, 1, 3), (2, 0, 1), (2, 1, 3),
                                                            (3, 1, 3)]
    assert [n.value for n in nodes] == [1.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.0, 1.0]
    assert [n.parent for n in nodes] == [-1, 0, 0, -1, 3, 3, -1, -1]
    assert ranked_pairs(nodes) == [(0, 3), (4, 5), (7, 6)]


def test_fit_ranker_meets_its_optimality_condition():
    """One pair, feature difference 3, l2 = 1: the minimiser of log(1 + e^(-3w)) + w^2 / 2 has
    -3 sigmoid(-3w) + w = 0."""
    w = fit_ranker(torch.tensor([[2.0]]), torch.tensor([[-1.0]]), l2=1.0, iters=30)
    assert float(w) > 0 and -3 / (1 + math.exp(3 * float(w))) + float(w) == pytest.approx(0.0, abs=1e-9)


def test_pum_by_hand():
    """Two flat replies (each a measured prefix: its whole completion), rewards 1 and 0, one-dimensional states
    0, 1, 2 and 0, 1, -1 (prompt, token 1, token 2): the head has w > 0, so the tokens' utility gains are
    w, w, w, -2w, RMS w sqrt(7/4). The advantage is GRPO's +-0.7071 plus coef x gain / RMS."""
    b = build_batch([[7]] * 2, [[5, 6], [5, 8]], [[0.0] * 2] * 2, [0, 0], [False] * 2, pad_id=0)
    b.rewards = torch.tensor([1.0, 0.0])
    states = torch.tensor([[[0.0], [1.0], [2.0]], [[0.0], [1.0], [-1.0]]])
    h, s = 1 / math.sqrt(2), math.sqrt(7 / 4)
    got = pum(b, states, coef=0.5, eps=0.0)
    assert got[0].tolist() == pytest.approx([0.0, h + 0.5 / s, h + 0.5 / s], rel=1e-6)
    assert got[1].tolist() == pytest.approx([0.0, -h + 0.5 / s, -h - 1.0 / s], rel=1e-6)
    assert pum(b, states, coef=0.0, eps=0.0)[:, 1:].flatten().tolist() == pytest.approx([h, h, -h, -h], rel=1e-6)


def test_a_tied_batch_is_grpo_and_features_are_checked():
    b = build_batch([[7]] * 2, [[5], [6]], [[0.0]] * 2, [0, 0], [False] * 2, pad_id=0)
    b.rewards = torch.tensor([1.0, 1.0])
    assert torch.count_nonzero(pum(b, torch.randn(2, 2, 3))) == 0
    with pytest.raises(ConfigError, match="hidden state at every position"):
        pum(b, torch.randn(2, 3))
    assert ADVANTAGES.get("pum").traits.features == "hidden_states"
