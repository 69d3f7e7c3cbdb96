"""Turn credit against hand computations: CTC-GRPO (GRPO's outcome advantage plus the centred per-turn credit on
each turn's tokens) and 3SPO's state-score step credit; a multi-turn batch's meta carries what they read."""
from __future__ import annotations

import pytest
import torch

from upslope.algos.turn_credit import ctc_grpo, state_score, turn_states
from upslope.batch import build_batch
from upslope.errors import ConfigError


def two_turn_batch():
    """One group of two trajectories after a 1-token prompt: row 0 has turns of 2 and 1 model tokens with an
    environment token between them (completion ids 0-1 model, 2 env, 3 model); row 1 one turn of 2 tokens."""
    b = build_batch(prompt_ids=[[7], [7]], completion_ids=[[5, 5, 9, 5], [5, 5]], completion_logprobs=[[-1.0] * 4,
                    [-1.0] * 2], group_ids=[0, 0], truncated=[False, False], pad_id=0,
                    completion_loss_masks=[[1, 1, 0, 1], [1, 1]])
    b.rewards = torch.tensor([1.0, 0.0])
    b.meta = [{"turn_spans": [(0, 2), (3, 4)], "turn_parts": [{"progress": 0.0}, {"progress": 0.6}]},
              {"turn_spans": [(0, 2)], "turn_parts": [{"progress": 0.0, "exec": 1.0}]}]
    return b


def test_ctc_grpo_by_hand():
    b = two_turn_batch()
    adv = ctc_grpo(b, coef=0.5)
    # outcome: rewards 1, 0: mean 0.5, unbiased std sqrt(0.5): +-0.5 / (0.70711 + 1e-6)
    o = 0.5 / (2 ** -0.5 + 1e-6)
    # turn credits 0, 0.6 (row 0) and 0 (row 1): mean 0.2; centred -0.2, 0.4, -0.2; x coef 0.5
    expect = torch.tensor([[0, o - 0.1, o - 0.1, 0, o + 0.2], [0, -o - 0.1, -o - 0.1, 0, 0]])
    assert torch.allclose(adv, expect.float(), atol=1e-5)
    # two parts summed: row 1's turn gains exec 1: credits 0, 0.6, 1, mean 1.6/3
    both = ctc_grpo(b, parts=["progress", "exec"], coef=1.0)
    assert float(both[1, 1]) == pytest.approx(-o + (1 - 1.6 / 3), abs=1e-5)
    assert torch.allclose(ctc_grpo(b, coef=0.0), torch.tensor([[0, o, o, 0, o], [0, -o, -o, 0, 0]]), atol=1e-5)


def test_ctc_grpo_keeps_masked_tokens_at_zero_and_needs_turns():
    b = two_turn_batch()
    assert float(ctc_grpo(b)[0, 3]) == 0.0  # the environment token between the turns
    b.meta = [{}, {}]
    with pytest.raises(ConfigError, match="rollout.kind=multi_turn"):
        ctc_grpo(b)


def three_trajectories():
    """One group after prompt P: A and B fail their first query, get the same feedback F and try again (A right,
    B wrong); C is right at once. Rows as in two_turn_batch; C has one turn."""
    b = build_batch(prompt_ids=[[7]] * 3, completion_ids=[[5, 5, 9, 5], [5, 5, 9, 5], [5, 5]],
                    completion_logprobs=[[-1.0] * 4, [-1.0] * 4, [-1.0] * 2], group_ids=[0, 0, 0],
                    truncated=[False] * 3, pad_id=0, completion_loss_masks=[[1, 1, 0, 1], [1, 1, 0, 1], [1, 1]])
    b.rewards = torch.tensor([1.0, 0.0, 1.0])
    two = [{"role": "user", "content": "P"}, {"role": "assistant", "content": "q1"},
           {"role": "user", "content": "F"}, {"role": "assistant", "content": "q2"}]
    b.meta = [{"example_id": "x", "messages": two, "turn_spans": [(0, 2), (3, 4)]},
              {"example_id": "x", "messages": two, "turn_spans": [(0, 2), (3, 4)]},
              {"example_id": "x", "messages": two[:2], "turn_spans": [(0, 2)]}]
    return b


def test_state_score_by_hand():
    """Scores: the start state (x, 0, P) 2/3 (A, B, C), the state after F (x, 1, F) 1/2 (A, B). Credits: A -1/6
    then 1 - 1/2; B -1/6 then 0 - 1/2; C 1 - 2/3. Each row's credits sum to its return minus the group mean."""
    b = three_trajectories()
    assert turn_states(b.meta[0]) == ["x|0|P", "x|1|F"]
    adv = state_score(b, scale_by_std=False)
    expect = torch.tensor([[0, -1 / 6, -1 / 6, 0, 0.5], [0, -1 / 6, -1 / 6, 0, -0.5], [0, 1 / 3, 1 / 3, 0, 0]])
    assert torch.allclose(adv, expect.float(), atol=1e-6)
    std = float(torch.tensor([1.0, 0.0, 1.0]).std())
    assert torch.allclose(state_score(b), expect.float() / (std + 1e-6), atol=1e-5)
    b.rewards = torch.ones(3)  # a tied group: every score is the common return, every credit 0
    assert float(state_score(b).abs().sum()) == 0.0


def test_a_turn_cut_by_the_budget_starts_from_the_last_message():
    meta = {"example_id": "x", "messages": [{"role": "user", "content": "P"}, {"role": "assistant", "content": "q"},
                                            {"role": "user", "content": "F"}], "turn_spans": [(0, 2), (3, 9)]}
    assert turn_states(meta) == ["x|0|P", "x|1|F"]
