"""GEOALIGN against a hand-computed case (alignment to the consensus, the flagged rollout, GRPO over the
rest of its group) and the hidden-state features the RL trainer hands it, against the tiny model's own
forward."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.geometry import consensus_alignment, displacements, geoalign, outliers
from upslope.batch import build_batch
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def one_token_batch(rewards: list[float], groups: list[int]):
    n = len(rewards)
    b = build_batch([[7]] * n, [[5]] * n, [[-0.5]] * n, groups, [False] * n, pad_id=0)
    b.rewards = torch.tensor(rewards)
    return b


def test_displacements_alignment_and_advantage_by_hand():
    """Four prompts, a rewarded and an unrewarded rollout each. Displacements (rewarded minus unrewarded):
    (2, 0), (1, 0), (-3, 0), (1.5, 0): unit vectors (1, 0) x 3 and (-1, 0), consensus (1, 0), alignments
    1, 1, -1, 1 (mean 0.5, population std sqrt(0.75)): the third prompt's rewarded rollout is 1.73 std below
    and flagged. Its group keeps one rollout (advantage 0); the others are GRPO's +-0.7071."""
    f = torch.tensor([[2.0, 0], [0, 0], [1, 1], [0, 1], [0, 0], [3, 0], [1.5, 0.1], [0, 0.1]])
    r = torch.tensor([1.0, 0, 1, 0, 1, 0, 1, 0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    moves, has = displacements(f, r, g)
    assert has.tolist() == [True, False] * 4
    assert torch.allclose(moves[has], torch.tensor([[2.0, 0], [1, 0], [-3, 0], [1.5, 0]], dtype=torch.float64))
    align = consensus_alignment(moves[has], 2)
    assert align.tolist() == pytest.approx([1.0, 1.0, -1.0, 1.0], abs=1e-9)
    assert outliers(align, 1.0).tolist() == [False, False, True, False]
    h = 1 / math.sqrt(2)
    adv = geoalign(one_token_batch(r.tolist(), g.tolist()), f, dim=2)[:, 1]
    assert adv.tolist() == pytest.approx([h, -h, h, -h, 0, 0, h, -h], rel=1e-5)
    wide = geoalign(one_token_batch(r.tolist(), g.tolist()), f, dim=2, tolerance=2.0)[:, 1]  # nothing flagged
    assert wide.tolist() == pytest.approx([h, -h] * 4, rel=1e-5)


def test_a_low_rank_projector_keeps_the_dominant_directions():
    """Rank 1: every vector projects on the top singular direction; the alignment is the sign of its coordinate."""
    v = torch.tensor([[3.0, 0.1], [2.0, -0.1], [-1.0, 0.0]])
    assert consensus_alignment(v, 1).tolist() == pytest.approx([1.0, 1.0, -1.0], abs=1e-9)


def test_groups_without_a_reward_difference_are_grpos():
    f = torch.tensor([[1.0, 0], [0, 1], [5, 5], [-5, 5]])
    adv = geoalign(one_token_batch([1, 1, 0, 0], [0, 0, 1, 1]), f)[:, 1]
    assert adv.tolist() == [0.0] * 4


def test_geoalign_without_features_is_one_line():
    with pytest.raises(ConfigError, match="needs each rollout's hidden-state features"):
        geoalign(one_token_batch([1, 0], [0, 0]))
    assert ADVANTAGES.get("geoalign").traits.features == "hidden_mean"


def test_hidden_mean_is_the_mean_state_before_each_trained_token(tiny_model_path):
    from upslope.models import load_model
    from upslope.train.learner.salience import hidden_mean

    model = load_model(tiny_model_path).eval()
    b = build_batch([[11, 12, 13], [11, 12]], [[21, 22], [31, 32, 33]], [[0.0] * 2, [0.0] * 3], [0, 1],
                    [False, False], pad_id=0)
    got = hidden_mean(model, b)
    with torch.no_grad():
        h0 = model.model(input_ids=torch.tensor([[11, 12, 13, 21, 22]])).last_hidden_state[0]
        h1 = model.model(input_ids=torch.tensor([[11, 12, 31, 32, 33]])).last_hidden_state[0]
    # row 0 trains tokens 3 and 4, chosen by the states at 2 and 3; row 1 trains 2, 3, 4, chosen at 1, 2, 3
    assert torch.allclose(got[0], h0[2:4].mean(0), atol=1e-5)
    assert torch.allclose(got[1], h1[1:4].mean(0), atol=1e-5)
