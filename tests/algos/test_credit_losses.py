"""PAEC's soft decision mask and entropy lower-bound penalty against hand computations, and its
gradient: only through the entropy of masked positions below the floor."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.credit_losses import decision_mask, paec
from upslope.algos.losses import ppo_clip
from upslope.errors import ConfigError
from upslope.registry import POLICY_LOSSES


def topk(*probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()  # [1, L, K]


def test_decision_mask_by_hand():
    # p = (0.5, 0.3, 0.2): top_p 0.75 keeps 0.5 and 0.3 (0.5 < 0.75, then 0.8 crosses), renormalised (5/8, 3/8)
    m = decision_mask(topk([0.5, 0.3, 0.2], [0.98, 0.01, 0.01]), top_p=0.75)[0]
    h = -(5 / 8 * math.log(5 / 8) + 3 / 8 * math.log(3 / 8)) / math.log(3)
    assert m[0].item() == pytest.approx(h * (1 - 0.2), rel=1e-5)
    assert m[1].item() == pytest.approx(0.0, abs=1e-9)  # the nucleus is one token: no local entropy


def test_paec_adds_the_masked_entropy_floor_penalty_and_its_gradient():
    lp = torch.tensor([[-0.7, -0.1]], requires_grad=True)
    ent = torch.tensor([[0.2, 0.9]], requires_grad=True)
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    tk = topk([0.5, 0.3, 0.2], [0.5, 0.3, 0.2])
    loss, metrics = paec(lp, lp.detach(), adv, mask, ent, tk, coef=0.1, h_min=0.5, top_p=1.0)
    m = decision_mask(tk, 1.0)[0, 0].item()
    base, _ = ppo_clip(lp, lp.detach(), adv, mask)
    assert (loss - base).tolist()[0] == pytest.approx([0.1 * m * 0.3, 0.0], rel=1e-5)  # only the token below 0.5
    loss.sum().backward()
    assert ent.grad.tolist()[0] == pytest.approx([-0.1 * m, 0.0], rel=1e-5)
    assert metrics["paec/penalty"].item() == pytest.approx(0.1 * m * 0.3 / 2, rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=6), st.floats(0.05, 1.0))
def test_decision_mask_is_in_unit_interval(weights, top_p):
    p = torch.tensor(sorted(weights, reverse=True))
    m = decision_mask((p / p.sum()).log()[None, None], top_p)
    assert 0.0 <= m.item() <= 1.0 + 1e-6


def test_paec_is_registered_for_token_stats_and_checks_inputs():
    traits = POLICY_LOSSES.get("paec").traits
    assert traits.token_stats is True and traits.top_k == 20 and not traits.zero_at_zero_advantage
    assert set(POLICY_LOSSES.get("paec").options()) == {"coef", "h_min", "top_p", "eps_low", "eps_high"}
    x = torch.zeros(1, 2)
    with pytest.raises(ConfigError):
        paec(x, x, x, torch.ones(1, 2))  # without the learner's internals
    with pytest.raises(ConfigError):
        paec(x, x, x, torch.ones(1, 2), x, torch.zeros(1, 2, 3), top_p=0.0)


def test_sr_ppo_reads_the_critic_as_pass_at_k_by_hand():
    from upslope.algos.credit_critic import pass_at_k, sr_ppo
    from upslope.batch import build_batch

    b = build_batch([[7]], [[5, 6]], [[-0.1, -0.1]], [0], [False], pad_id=0)
    b.rewards, b.values = torch.tensor([1.0]), torch.tensor([[0.0, 0.5, 0.2]])
    # k = 2: g(0.5) = 0.75, g(0.2) = 0.36, the terminal g(1) = 1
    adv, ret = sr_ppo(b, k=2, lam=0.0)
    assert adv[0, 1:].tolist() == pytest.approx([0.36 - 0.75, 1 - 0.36], rel=1e-5) and adv[0, 0] == 0
    assert ret.tolist() == [[0.0, 1.0, 1.0]]  # the critic's target: the outcome, pass@1
    mc, _ = sr_ppo(b, k=2, lam=1.0)
    assert mc[0, 1:].tolist() == pytest.approx([1 - 0.75, 1 - 0.36], rel=1e-5)
    assert pass_at_k(torch.tensor([0.0, 1.0, 1.5]), 8).tolist() == [0.0, 1.0, 1.0]
    with pytest.raises(ConfigError):
        sr_ppo(b, k=0)


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(1, 16))
def test_pass_at_k_stretches_credit_where_success_is_marginal(p, q, k):
    from upslope.algos.credit_critic import pass_at_k

    lo, hi = sorted([p, q])
    g = pass_at_k(torch.tensor([lo, hi], dtype=torch.float64), k)
    assert g[0] <= g[1] + 1e-12 and bool(((g >= 0) & (g <= 1)).all())
    assert g[1] - g[0] >= (hi - lo) * (1 - hi) ** (k - 1) * k - 1e-9  # slope >= g'(hi) (concave)
