"""TreeRPO's segment advantage and CATPO's tree weights against hand-computed trees,
plus two properties: without a tree it is GRPO, and in a balanced tree the segment credits along a leaf's
path add up to the leaf's reward minus its group's mean."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.tree import segments
from upslope.batch import build_batch
from upslope.registry import ADVANTAGES


def tree_batch(trees, rewards, lengths, groups=None, logprobs=None):
    """Rows with prompt [7, 7], `lengths` completion tokens, meta["tree"] = (nodes, ends) per row."""
    n = len(rewards)
    lps = logprobs or [-0.5] * n
    b = build_batch([[7, 7]] * n, [[5] * k for k in lengths], [[lp] * k for lp, k in zip(lps, lengths)],
                    groups or [0] * n, [False] * n, 0,
                    meta=[{"tree": {"nodes": nodes, "ends": ends}} if nodes else {} for nodes, ends in trees])
    b.rewards = torch.tensor(rewards, dtype=torch.float32)
    return b


# prompt -> nodes 0 and 1 (segment: token 0), each -> two leaves (tokens 1-2); rewards 1, 0, 0, 0
FOUR = [(["0", "0.0"], [1]), (["0", "0.1"], [1]), (["1", "1.0"], [1]), (["1", "1.1"], [1])]


def completion(adv, b):
    return [adv[i, int(b.prompt_lens[i]):int(b.seq_lens[i])].tolist() for i in range(b.size)]


def test_segments():
    assert segments([], 3) == [(0, 3)]
    assert segments([1, 2], 5) == [(0, 1), (1, 2), (2, 5)]


def test_segment_credit_by_hand():
    """V(0) = 0.5, V(1) = 0: siblings centred on 0.25 -> +-0.25 on token 0; V(0.0) = 1, V(0.1) = 0 -> +-0.5 on
    tokens 1-2; node 1's leaves tie -> exactly 0. With the std (unbiased, of two values 0.354 and 0.707) every
    non-tied sibling pair gets +-0.7071. Prompt positions stay 0."""
    b = tree_batch(FOUR, [1.0, 0.0, 0.0, 0.0], [3] * 4)
    adv = ADVANTAGES.bind("tree", {"scale_by_std": False})(b)
    assert completion(adv, b) == [[0.25, 0.5, 0.5], [0.25, -0.5, -0.5], [-0.25, 0.0, 0.0], [-0.25, 0.0, 0.0]]
    assert (adv[:, :2] == 0).all()
    scaled = [x for row in completion(ADVANTAGES.bind("tree")(b), b) for x in row]
    s = 1 / math.sqrt(2)
    assert scaled == pytest.approx([s, s, s, s, -s, -s, -s, 0, 0, -s, 0, 0], abs=1e-5)


def test_a_graft_is_compared_with_the_branches_beside_it():
    """A grafted leaf h0 under the prompt (reward 1): the root's children 0, 1, h0 have values 0.5, 0, 1, mean
    0.5: node 0 gets 0, node 1 -0.5, the graft +0.5 on all its tokens; below node 0 nothing changes."""
    b = tree_batch(FOUR + [(["h0"], [])], [1.0, 0.0, 0.0, 0.0, 1.0], [3, 3, 3, 3, 2])
    adv = completion(ADVANTAGES.bind("tree", {"scale_by_std": False})(b), b)
    assert adv == [[0.0, 0.5, 0.5], [0.0, -0.5, -0.5], [-0.5, 0.0, 0.0], [-0.5, 0.0, 0.0], [0.5, 0.5]]


def test_leaf_credit_is_grpo_over_the_leaves():
    b = tree_batch(FOUR, [1.0, 0.0, 0.0, 1.0], [3] * 4)
    assert torch.equal(ADVANTAGES.bind("tree", {"credit": "leaf"})(b), ADVANTAGES.bind("grpo")(b))


def test_informativeness_weights_by_hand():
    """Tree A: rewards 1, 0, 0, 0 (p = 1/4: diversity 0.75), confidences -1, -2, -3, -4: corr(conf, reward) =
    1.5 / sqrt(5 x 0.75) = 0.7746, F = 0.75 x 0.2254 = 0.1690. Tree B: 1, 1, 0, 0, equal confidences: F = 1.
    Weights F / mean F over the 8 leaves (0.5845): 0.2892 and 1.7108. With min_informativeness 0.5 tree A is
    dropped and B keeps weight 1; with `outcome` only the weights are 0.75 and 1 over 0.875."""
    trees = [([f"{g}", f"{g}.{j}"], [1]) for g in "01" for j in "01"] * 2
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    b = tree_batch(trees, rewards, [2] * 8, groups=[0] * 4 + [1] * 4, logprobs=[-1, -2, -3, -4] + [-1] * 4)
    base = ADVANTAGES.bind("tree")(b)
    corr = 1.5 / math.sqrt(5 * 0.75)
    fa = 0.75 * (1 - corr)
    w = torch.tensor([fa] * 4 + [1.0] * 4) / ((4 * fa + 4) / 8)
    got = ADVANTAGES.bind("tree", {"informativeness": "outcome_decorrelation"})(b)
    assert torch.allclose(got, base * w[:, None], atol=1e-6)
    filtered = ADVANTAGES.bind("tree", {"informativeness": "outcome_decorrelation", "min_informativeness": 0.5})(b)
    assert (filtered[:4] == 0).all() and torch.allclose(filtered[4:], base[4:])
    outcome = ADVANTAGES.bind("tree", {"informativeness": "outcome"})(b)
    assert torch.allclose(outcome, base * (torch.tensor([0.75] * 4 + [1.0] * 4) / 0.875)[:, None], atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=1, max_size=6))
def test_without_a_tree_it_is_grpo(rewards):
    b = tree_batch([(None, None)] * len(rewards), rewards, [2] * len(rewards))
    assert torch.equal(ADVANTAGES.bind("tree")(b), ADVANTAGES.bind("grpo")(b))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(2, 3), st.integers(0, 2), st.data())
def test_segment_credits_telescope_in_a_balanced_tree(roots, branches, levels, data):
    """Siblings' mean is their parent's value, so along a leaf's path sum_nodes (V(node) - V(parent)) = R - V(root)."""
    leaves = [[r] for r in range(roots)]
    for _ in range(levels):
        leaves = [p + [c] for p in leaves for c in range(branches)]
    rewards = data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=len(leaves), max_size=len(leaves)))
    trees = [([".".join(map(str, p[:k + 1])) for k in range(levels + 1)], list(range(1, levels + 1))) for p in leaves]
    b = tree_batch(trees, rewards, [levels + 2] * len(leaves))
    adv = ADVANTAGES.bind("tree", {"scale_by_std": False})(b)
    mean = sum(rewards) / len(rewards)
    for i, r in enumerate(rewards):
        p = int(b.prompt_lens[i])
        per_node = [float(adv[i, p + s]) for s, _ in segments(list(range(1, levels + 1)), levels + 2)]
        assert sum(per_node) == pytest.approx(r - mean, abs=1e-6)
