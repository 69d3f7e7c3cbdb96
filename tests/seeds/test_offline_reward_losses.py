"""SRO and BRO, offline losses on soft or binarised scalar rewards, against hand computations: the soft label,
the margin SRO settles at, DPO as SRO's limit, BRO's unpaired logistic terms; and the pair rewards reach the
loss through the preference objective (a real micro-batch of pair rows)."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.algos.preference import PairLogps, PairRewards, bro, sigmoid, sro
from upslope.registry import PREFERENCE_LOSSES
from upslope.train.methods.pair_batch import pair_batch, pair_rewards, sequence_logps


def logps(chosen: float, rejected: float, grad: bool = False) -> PairLogps:
    c, r = (torch.tensor([float(x)], requires_grad=grad) for x in (chosen, rejected))
    return PairLogps(c, r, torch.tensor([3.0]), torch.tensor([4.0]))


def rewards(chosen: float, rejected: float) -> PairRewards:
    return PairRewards(torch.tensor([chosen]), torch.tensor([rejected]))


def ls(x: float) -> float:
    return -math.log1p(math.exp(-x))  # log sigmoid


def test_sro_by_hand():
    """beta 0.5: chosen 0.5 (-2 - -3), rejected -0.5 (-5 - -4), margin h 1; rewards 0.8 and 0.3 at temperature
    0.25 give the label sigmoid(2); loss -(t log s(1) + (1 - t) log s(-1))."""
    out = sro(logps(-2, -5), logps(-3, -4), rewards(0.8, 0.3), beta=0.5, temperature=0.25)
    t = 1 / (1 + math.exp(-2))
    assert float(out.loss) == pytest.approx(-(t * ls(1) + (1 - t) * ls(-1)), rel=1e-6)
    assert float(out.chosen_reward) == pytest.approx(0.5) and float(out.rejected_reward) == pytest.approx(-0.5)


def test_sro_settles_where_the_margin_is_the_scaled_reward_gap():
    """The gradient vanishes at h = (r_c - r_r) / temperature and points toward it on either side."""
    gap = (0.9 - 0.4) / 0.5
    for margin, sign in ((gap, 0), (gap - 1, -1), (gap + 1, 1)):
        pol = logps(margin / 0.2, 0.0, grad=True)  # beta 0.2: h = 0.2 x (pi_c - 0) = margin
        sro(pol, logps(0, 0), rewards(0.9, 0.4), beta=0.2, temperature=0.5).loss.sum().backward()
        g = float(pol.chosen.grad)
        assert (abs(g) < 1e-7) if sign == 0 else (g * sign > 0)  # descent moves h toward the gap
    # equal rewards ask for no margin: the label is 1/2
    tied = sro(logps(-1, -1), logps(-1, -1), rewards(0.5, 0.5))
    assert float(tied.loss) == pytest.approx(math.log(2))


def test_dpo_is_sros_cold_limit():
    a, b = logps(-2, -5), logps(-3, -4)
    cold = sro(a, b, rewards(1.0, 0.0), beta=0.1, temperature=1e-3)
    assert float(cold.loss) == pytest.approx(float(sigmoid(a, b, beta=0.1).loss), rel=1e-6)


def test_bro_by_hand():
    """beta 0.5: chosen z 0.5, rejected z -0.5. Rewards 1 / 0 (threshold 0.5): -log s(0.5) each. Both above the
    threshold: -(log s(0.5) + log s(-0.5)) / 2. A shift of 0.5 moves the boundary."""
    pol, ref = logps(-2, -5), logps(-3, -4)
    assert float(bro(pol, ref, rewards(1, 0), beta=0.5).loss) == pytest.approx(-ls(0.5))
    assert float(bro(pol, ref, rewards(0.9, 0.7), beta=0.5).loss) == pytest.approx(-(ls(0.5) + ls(-0.5)) / 2)
    assert float(bro(pol, ref, rewards(1, 0), beta=0.5, shift=0.5).loss) == pytest.approx(-(ls(0.0) + ls(1.0)) / 2)


def test_unpaired_bro_raises_both_desirable_replies():
    pol = logps(-2, -5, grad=True)
    bro(pol, logps(-3, -4), rewards(0.9, 0.7), beta=0.5).loss.sum().backward()
    assert float(pol.chosen.grad) < 0 and float(pol.rejected.grad) < 0  # descent raises both log-probs


def test_pair_rows_carry_their_rewards_to_the_loss():
    """A pair batch whose chosen row is second: pair_rewards and sequence_logps agree on which is chosen, and
    the registered losses say they take rewards."""
    b = pair_batch([[1, 2], [3]], [[5, 6], [7]], [[8], [9, 9]], [0, 1], pad_id=0)
    b.rewards = torch.tensor([0.2, 0.9, 0.7, 0.1])  # pair 0: the second row is the better one
    r = pair_rewards(b)
    assert r.chosen.tolist() == pytest.approx([0.9, 0.7]) and r.rejected.tolist() == pytest.approx([0.2, 0.1])
    tok = torch.zeros(b.loss_mask.shape)
    tok[1] = 1.0  # row 1's tokens each log-prob 1: its sum is its trained token count
    assert sequence_logps(tok, b).chosen[0] == b.loss_mask[1].sum()
    assert PREFERENCE_LOSSES.get("sro").traits.rewards and PREFERENCE_LOSSES.get("bro").traits.rewards
    assert not PREFERENCE_LOSSES.get("sigmoid").traits.rewards
