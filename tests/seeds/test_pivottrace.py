"""PivotTrace against hand-computed cases: the attention shift between consecutive tokens, the pivot density
of a rollout, the three-way routing of prompts by uncertainty and the advantage each route gets; the
attention shifts of the tiny model's real forward."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.triage import pivot_density, pivottrace, triage
from upslope.batch import build_batch
from upslope.errors import ConfigError
from upslope.train.learner.salience import attention_shift, attention_shift_of


def test_attention_shift_by_hand():
    """Rows (1, 0, 0), (.5, .5, 0), (.6, 0, .4): at t = 1 both rows see only column 0 (shift 0); at t = 2 row 2
    over columns 0-1 is (1, 0) renormalised, row 1 is (.5, .5): total variation 0.5."""
    attn = torch.tensor([[[1.0, 0, 0], [0.5, 0.5, 0], [0.6, 0, 0.4]]])
    assert attention_shift_of(attn)[0].tolist() == pytest.approx([0.0, 0.0, 0.5])


def test_pivot_density_by_hand():
    """(0, .1, .1, .1, .9): mean .24, population std sqrt(.1104); only .9 is above mean + std: 1 of 5. Without the
    first token: (.1, .1, .1, .9), mean .3, std sqrt(.12): 1 of 4."""
    shift = torch.tensor([[0.0, 0.1, 0.1, 0.1, 0.9]] * 2)
    mask = torch.tensor([[1.0] * 5, [0.0] + [1.0] * 4])
    assert pivot_density(shift, mask, 1.0).tolist() == pytest.approx([0.2, 0.25])
    assert pivot_density(torch.full((1, 3), 0.2), torch.ones(1, 3), 0.0).tolist() == [0.0]  # flat: no pivot


def test_triage_by_hand():
    # uncertainties 0.3, 0.1, 0.2: rank shares (r + 0.5) / 3 = 5/6, 1/6, 1/2
    assert triage(torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64), 0.33, 0.67).tolist() == [2, 0, 1]
    assert triage(torch.tensor([0.3, 0.1], dtype=torch.float64), 0.0, 1.0).tolist() == [1, 1]  # all labelled


def batch_with_shifts(shifts: list[list[float]]):
    n = len(shifts)
    b = build_batch([[7]] * n, [[5] * 4] * n, [[-0.5] * 4] * n, [i // 2 for i in range(n)], [False] * n, pad_id=0)
    b.reward_components = {"correct": torch.tensor([1.0, 0] * (n // 2)),
                           "self": torch.tensor([0.0, 1, 1, 1, 0, 1][:n])}
    b.rewards = b.reward_components["correct"].clone()
    return b, torch.tensor([[0.0] + s for s in shifts])


def test_pivottrace_routes_and_advantages_by_hand():
    """z 0.5. Group 0: flat shifts, density 0, the least uncertain: GRPO on the self-reward (0, 1). Group 1:
    one spike in four tokens (density .25): GRPO on the label (1, 0). Group 2: two of four above the
    threshold .75 (density .5), the most uncertain: skipped."""
    flat, one, two = [0.1] * 4, [0.1, 0.1, 0.1, 0.9], [0.0, 0.0, 1.0, 1.0]
    b, shifts = batch_with_shifts([flat, flat, one, one, two, two])
    h = 1 / math.sqrt(2)
    adv = pivottrace(b, shifts, z=0.5)[:, 1]
    assert adv.tolist() == pytest.approx([-h, h, h, -h, 0, 0], rel=1e-5)


def test_pivottrace_bad_input_is_one_line():
    b, shifts = batch_with_shifts([[0.1] * 4] * 2)
    with pytest.raises(ConfigError, match=r"no reward component \['votes'\]"):
        pivottrace(b, shifts, self_reward="votes")
    with pytest.raises(ConfigError, match="0 <= low <= high <= 1"):
        pivottrace(b, shifts, low=0.8, high=0.2)
    with pytest.raises(ConfigError, match="needs the policy's attention shifts"):
        pivottrace(b)


def test_attention_shift_of_the_tiny_model(tiny_model_path):
    from upslope.models import load_model

    model = load_model(tiny_model_path).eval()
    b = build_batch([[11, 12, 13]], [[21, 22, 23]], [[0.0] * 3], [0], [False], pad_id=0)
    got = attention_shift(model, b, 1)
    assert got.shape == (1, 6) and got[0, 0] == 0 and got[0, 1] == 0  # token 1 sees only token 0, as token 0 did
    assert bool(((got >= 0) & (got <= 1 + 1e-6)).all()) and float(got[0, 2:].sum()) > 0
