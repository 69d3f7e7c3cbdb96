"""GeoMin against a hand-computed case (the labelled rollouts' Gaussian feature model, the weights of the
self-rewarded rollouts), its labelled split, and the majority-vote self-reward."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.geometry import geomin, is_labelled, right_posterior
from upslope.batch import build_batch
from upslope.errors import ConfigError
from upslope.rewards.self_reward import majority_vote


def batch_of(correct: list[float], self_: list[float], groups: list[int], labelled: list[bool]):
    n = len(correct)
    b = build_batch([[7]] * n, [[5]] * n, [[-0.5]] * n, groups, [False] * n, pad_id=0,
                    meta=[{"labelled": x, "example_id": g} for x, g in zip(labelled, groups)])
    b.reward_components = {"correct": torch.tensor(correct), "self": torch.tensor(self_)}
    b.rewards = torch.tensor(correct)
    return b


def test_geomin_by_hand():
    """Labelled group: correct 1, 1, 0, 0 at features 1, 3, -1, -3: class means 2 and -2, pooled variance
    (1 + 1 + 1 + 1) / 2 = 2, so logit(f) = (f - 0) x 4 / 2 (equal priors). Unlabelled group: self-rewards
    1, 0 at features 0.5, -0.25: P(right) = sigmoid(1), sigmoid(-0.5); the first is trusted with
    sigmoid(1) (it says right), the second with 1 - sigmoid(-0.5) (it says wrong). Their GRPO advantages
    +-0.7071 are scaled by those; the labelled group keeps GRPO's +-0.866 on the verifier."""
    f = torch.tensor([[1.0], [3.0], [-1.0], [-3.0], [0.5], [-0.25]])
    b = batch_of([1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1], [True] * 4 + [False] * 2)
    right = torch.tensor([True, True, False, False, False, False])
    wrong = torch.tensor([False, False, True, True, False, False])
    post = right_posterior(f, right, wrong, eps=0.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert post[4:].tolist() == pytest.approx([sig(1.0), sig(-0.5)])
    adv = geomin(b, f, eps=1e-12)[:, 1]
    h, g = 1 / math.sqrt(2), 0.5 / math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([g, g, -g, -g, h * sig(1.0), -h * (1 - sig(-0.5))], rel=1e-5)
    # a batch whose labelled rollouts are all right cannot fit the model: the unlabelled get fallback_weight
    lone = batch_of([1, 1, 1, 1], [0, 0, 1, 0], [0, 0, 1, 1], [True, True, False, False])
    assert geomin(lone, f[:4], fallback_weight=0.5)[:, 1].tolist() == pytest.approx([0, 0, 0.5 * h, -0.5 * h], rel=1e-5)


def test_labelled_split_and_bad_components():
    metas = [{"example_id": f"arith-train-{i}"} for i in range(400)]
    assert not is_labelled(metas, 0.0, "labelled").any() and is_labelled(metas, 1.0, "labelled").all()
    tenth = is_labelled(metas, 0.1, "labelled")
    assert 20 <= int(tenth.sum()) <= 60 and torch.equal(tenth, is_labelled(metas, 0.1, "labelled"))
    assert is_labelled([{"labelled": False, "example_id": "x"}], 1.0, "labelled").tolist() == [False]
    b = batch_of([1, 0], [1, 0], [0, 0], [True, True])
    with pytest.raises(ConfigError, match=r"no reward component \['votes'\]"):
        geomin(b, torch.zeros(2, 1), self_reward="votes")
    with pytest.raises(ConfigError, match="needs each rollout's hidden-state features"):
        geomin(b)


def test_majority_vote_by_hand():
    texts = ["5", "the answer is 5", "6", "no number", "7", "8"]
    metas = [{"example_id": "a"}] * 4 + [{"example_id": "b"}] * 2
    # group a: 5 twice, 6 once, one without a number; group b: a tie, the first seen (7) wins
    assert majority_vote(texts, [None] * 6, metas) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert majority_vote(["x", "y"], [None] * 2, [{"example_id": "c"}] * 2) == [0.0, 0.0]
