"""Hista and Numca against hand-computed cases: the other rollouts' returns weighted by hidden-state similarity
(per token, by the state that chooses it), and the numeric milestones' values placed where the numbers end;
the per-position hidden states the RL trainer hands Hista, against the tiny model's own forward."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.state_value import hista, hista_values, others_value
from upslope.batch import build_batch
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, REWARDS
from upslope.rewards.milestones import milestone_parts, milestones, numca
from upslope.rewards.placement import PlacedReward

LN3 = math.log(3.0)


def three_rollouts(rewards: list[float]):
    """Row 0 has two completion tokens, rows 1 and 2 one; one group. States [3, 3, 2]: row 0's state at 0 is
    (0, 1) (it chooses token 1) and at 1 is (1, 0) (chooses token 2); row 1's (0, 1); row 2's (1, 0)."""
    b = build_batch([[7]] * 3, [[5, 6], [5], [5]], [[0.0, 0.0], [0.0], [0.0]], [0, 0, 0], [False] * 3, pad_id=0)
    b.rewards = torch.tensor(rewards)
    states = torch.zeros(3, 3, 2)
    states[0, 0], states[0, 1], states[1, 0], states[2, 0] = (torch.tensor(v) for v in ([0., 1], [1., 0], [0., 1],
                                                                                        [1., 0]))
    return b, states


def test_hista_values_by_hand():
    """Temperature 1/ln 3: a cosine of 1 against 0 weighs 3 : 1. Returns 0, 1, 0. Mean states: row 0 (0.5, 0.5),
    row 1 (0, 1), row 2 (1, 0). Row 0's token 1 (state (0, 1)): row 1 cos 1, row 2 cos 0: V = 3/4 x 1; its token 2
    (state (1, 0)): V = 1/4. Row 1 (state (0, 1)): row 0 cos 1/sqrt 2, row 2 cos 0: V = 0 (both returned 0). Row 2
    (state (1, 0)): row 0 at 3^(1/sqrt 2), row 1 at 1: V = 1 / (1 + 3^(1/sqrt 2))."""
    b, states = three_rollouts([0.0, 1.0, 0.0])
    v = hista_values(states, b.loss_mask, b.rewards, b.group_ids, 1 / LN3)
    w = 1 / (1 + 3 ** (1 / math.sqrt(2)))
    assert v[0, 1:].tolist() == pytest.approx([0.75, 0.25])
    assert v[1, 1].item() == pytest.approx(0.0) and v[2, 1].item() == pytest.approx(w)
    assert v[0, 0].item() == 0.0 and v[1, 2].item() == 0.0  # prompt and padding: no value
    adv = hista(b, states, temperature=1 / LN3, scale_by_std=False)
    assert adv[0, 1:].tolist() == pytest.approx([-0.75, -0.25]) and adv[1, 1].item() == pytest.approx(1.0)
    assert adv[2, 1].item() == pytest.approx(-w)
    std = math.sqrt(1 / 3)  # the group's reward std (n - 1)
    assert hista(b, states, temperature=1 / LN3, eps=0.0)[1, 1].item() == pytest.approx(1 / std, rel=1e-6)


def test_a_high_temperature_is_the_leave_one_out_mean_and_a_tied_group_is_zero():
    b, states = three_rollouts([0.0, 1.0, 0.0])
    rloo = hista(b, states, temperature=1e9, scale_by_std=False)
    assert [rloo[0, 1].item(), rloo[1, 1].item(), rloo[2, 1].item()] == pytest.approx([-0.5, 1.0, -0.5])
    tied, _ = three_rollouts([1.0, 1.0, 1.0])
    assert torch.count_nonzero(hista(tied, states)) == 0


def test_hista_needs_per_position_states():
    b, states = three_rollouts([0.0, 1.0, 0.0])
    with pytest.raises(ConfigError, match="hidden state at every position"):
        hista(b, states.mean(1))
    assert ADVANTAGES.get("hista").traits.features == "hidden_states"


def test_others_value_falls_back_where_no_rollout_informs():
    r = torch.tensor([1.0, 0.0, 1.0])
    got = others_value(r, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 0.25)
    assert got.tolist() == [0.5, 0.25]


def test_numca_parts_by_hand():
    """Answer 12 (last number). Replies: '5 then 12' right, '5 then 11' wrong, '6 then 12' right, '4' wrong.
    For the first: V0 = mean of the others = 1/3; '5' (ends at 1) was written by the wrong one only: V = 0, part
    -1/3; '12' (ends at 9) by a right one: V = 1, part +1; at the end, 1 - 1 = 0. For '4': V0 = 2/3, no other
    wrote 4 (V stays), and 0 - 2/3 at the end."""
    texts = ["5 then 12", "5 then 11", "6 then 12", "4"]
    metas = [{"example_id": "a"}] * 4
    out = numca(texts, [12] * 4, metas, verifier_options={"extract": "last"})
    assert all(isinstance(o, PlacedReward) for o in out)
    assert [e for e, _ in out[0].parts] == [1, 9, 9] and [v for _, v in out[0].parts] == pytest.approx([-1 / 3, 1, 0])
    assert [e for e, _ in out[3].parts] == [1, 1] and [v for _, v in out[3].parts] == pytest.approx([0, -2 / 3])
    assert [float(o) for o in out] == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3])  # correct - V0
    assert milestones("7 and 7.5 and 7", r"-?\d+(?:\.\d+)?") == [("7", 1), ("7.5", 9)]  # first appearances
    assert milestone_parts("3", 1.0, [], r"\d+") == ((1, 0.0),)  # alone in its group: nothing to compare with
    assert REWARDS.get("numca").traits.places_tokens({})


def test_hidden_states_are_the_models_own(tiny_model_path):
    from upslope.models import load_model
    from upslope.train.learner.salience import hidden_states

    model = load_model(tiny_model_path).eval()
    b = build_batch([[11, 12, 13], [11, 12]], [[21, 22], [31]], [[0.0] * 2, [0.0]], [0, 1], [False, False], pad_id=0)
    got = hidden_states(model, b)
    with torch.no_grad():
        h0 = model.model(input_ids=torch.tensor([[11, 12, 13, 21, 22]])).last_hidden_state[0]
        h1 = model.model(input_ids=torch.tensor([[11, 12, 31]])).last_hidden_state[0]
    assert got.shape == (2, 5, h0.shape[-1])
    assert torch.allclose(got[0], h0, atol=1e-5) and torch.allclose(got[1, :3], h1, atol=1e-5)
    assert torch.count_nonzero(got[1, 3:]) == 0  # padding
