"""DiRL against a hand-computed case: the batch's success direction, each rollout's novelty projected on it as a
reward bonus before GRPO, and a direction read from a file."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.direction import direction_bonus, dirl, success_direction
from upslope.batch import build_batch
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES

# group 0: rewarded (2, 0) and unrewarded (0, 0); group 1 tied at 0: (1, 1) and (-1, 1)
FEATURES = torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.0, 1.0], [-1.0, 1.0]])


def four_rollouts():
    b = build_batch([[7]] * 4, [[5]] * 4, [[-0.5]] * 4, [0, 0, 1, 1], [False] * 4, pad_id=0)
    b.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    return b


def test_dirl_by_hand():
    """Success direction: group 0's rewarded minus unrewarded state, (2, 0), as a unit vector (1, 0). Novelties
    (state minus group mean): (1, 0), (-1, 0), (1, 0), (-1, 0); RMS norm 1, so the bonus is 1, -1, 1, -1.
    With coef 0.5 the shaped rewards are 1.5, -0.5, 0.5, -0.5: group 0 keeps GRPO's +-0.7071 and the tied
    group 1 now gets +-0.7071 toward the rollout that moved along the direction (without std: +-1, +-0.5)."""
    b = four_rollouts()
    d = success_direction(FEATURES, b.rewards, b.group_ids)
    assert d.tolist() == pytest.approx([1.0, 0.0])
    assert direction_bonus(FEATURES, b.group_ids, d).tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
    h = 1 / math.sqrt(2)
    assert dirl(b, FEATURES, coef=0.5, eps=0.0)[:, 1].tolist() == pytest.approx([h, -h, h, -h], rel=1e-6)
    plain = dirl(b, FEATURES, coef=0.5, scale_by_std=False)[:, 1]
    assert plain.tolist() == pytest.approx([1.0, -1.0, 0.5, -0.5])
    assert dirl(b, FEATURES, coef=0.0, scale_by_std=False)[:, 1].tolist() == pytest.approx([0.5, -0.5, 0, 0])


def test_a_batch_without_a_reward_difference_has_no_direction():
    b = four_rollouts()
    b.rewards = torch.zeros(4)
    assert success_direction(FEATURES, b.rewards, b.group_ids) is None
    assert torch.count_nonzero(dirl(b, FEATURES)) == 0


def test_a_direction_from_a_file(tmp_path):
    """Along (0, 1) every novelty projects to 0: the tied group gets no bonus, group 0 is GRPO's."""
    path = tmp_path / "direction.pt"
    torch.save(torch.tensor([0.0, 3.0]), path)
    got = dirl(four_rollouts(), FEATURES, coef=1.0, direction_path=str(path), scale_by_std=False)[:, 1]
    assert got.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    torch.save(torch.zeros(3), tmp_path / "wide.pt")
    with pytest.raises(ConfigError, match="a direction of 3 dimensions for hidden states of 2"):
        dirl(four_rollouts(), FEATURES, direction_path=str(tmp_path / "wide.pt"))
    (tmp_path / "bad.pt").write_text("not a tensor")
    with pytest.raises(ConfigError, match=r"direction_path=.*bad.pt: cannot read a saved tensor"):
        dirl(four_rollouts(), FEATURES, direction_path=str(tmp_path / "bad.pt"))
    with pytest.raises(ConfigError, match="needs each rollout's hidden-state features"):
        dirl(four_rollouts())
    assert ADVANTAGES.get("dirl").traits.features == "hidden_mean"
