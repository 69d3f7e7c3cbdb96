"""CTC-GRPO against a hand computation: GRPO's outcome advantage plus the centred per-turn credit on each turn's
tokens; a multi-turn batch's meta carries the spans and parts it reads."""
from __future__ import annotations

import pytest
import torch

from upslope.algos.turn_credit import ctc_grpo
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
