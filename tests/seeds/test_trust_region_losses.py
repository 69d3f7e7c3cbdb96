"""DPPO and DRPO (probability-shift trust regions) against hand-computed tokens, and their limits:
DPPO with a region wider than any shift and DRPO without its penalty are the unclipped policy gradient."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.losses import dppo, drpo, ppo_clip
from upslope.errors import ConfigError
from upslope.registry import POLICY_LOSSES

FAST = settings(max_examples=60, deadline=None)


def grad_of(fn, lp, old, adv, mask, **opts):
    """(per-token loss, d sum(loss) / d logprobs, metrics)."""
    x = lp.clone().requires_grad_(True)
    loss, metrics = fn(x, old, adv, mask, **opts)
    loss.sum().backward()
    return loss.detach(), x.grad, metrics


# p_old = 0.5, 0.1, 0.5 and ratios 1.6, 3.0, 0.4: p_new = 0.8, 0.3, 0.2, shifts +0.3, +0.2, -0.3
P_OLD = torch.tensor([[0.5, 0.1, 0.5]], dtype=torch.float64)
RATIO = torch.tensor([[1.6, 3.0, 0.4]], dtype=torch.float64)
OLD, LP = P_OLD.log(), (P_OLD * RATIO).log()
MASK = torch.ones(1, 3, dtype=torch.float64)


def test_dppo_masks_by_absolute_probability_shift_on_three_tokens():
    up = torch.ones(1, 3, dtype=torch.float64)
    loss, g, m = grad_of(dppo, LP, OLD, up, MASK, delta=0.25)
    # A > 0: token 0 moved up by 0.3 > 0.25 (masked); token 1 moved up by 0.2 (kept although its
    # ratio is 3, which PPO's clip would have stopped); token 2 moved down (not harmful: kept)
    assert torch.allclose(loss, -RATIO)
    assert torch.allclose(g, torch.tensor([[0.0, -3.0, -0.4]], dtype=torch.float64))
    assert m["trust/masked_frac"].item() == pytest.approx(1 / 3)
    _, g_ppo, _ = grad_of(ppo_clip, LP, OLD, up, MASK)
    assert g_ppo[0, 1] == 0 and g[0, 1] != 0
    # A < 0: now token 2 (moved down by 0.3) is the harmful one
    _, g, _ = grad_of(dppo, LP, OLD, -up, MASK, delta=0.25)
    assert torch.allclose(g, torch.tensor([[1.6, 3.0, 0.0]], dtype=torch.float64))
    # direction "both": any shift past delta is masked
    _, g, _ = grad_of(dppo, LP, OLD, up, MASK, delta=0.25, direction="both")
    assert torch.allclose(g, torch.tensor([[0.0, -3.0, 0.0]], dtype=torch.float64))


def test_drpo_penalty_value_and_gradient_by_hand():
    p_old, r, a, delta = 0.5, 1.5, 2.0, 0.2
    lp, old, adv, one = (torch.tensor([[v]], dtype=torch.float64) for v in (math.log(p_old * r), math.log(p_old), a, 1))
    loss, g, m = grad_of(drpo, lp, old, adv, one, delta=delta)
    d = p_old * (r - 1)  # 0.25, beyond the boundary 0.2
    assert loss.item() == pytest.approx(-a * r + a * d * d / (2 * delta * p_old))  # -3 + 0.625
    assert g.item() == pytest.approx(-a * r * (1 - d / delta))  # +0.75: pulls back
    assert m["trust/beyond_frac"].item() == 1.0
    # on the boundary the gradient is exactly 0; inside it has the policy gradient's sign, attenuated
    for ratio, want in ((1.4, 0.0), (1.2, -a * 1.2 * (1 - 0.1 / delta))):
        lp = torch.tensor([[math.log(p_old * ratio)]], dtype=torch.float64)
        _, g, _ = grad_of(drpo, lp, old, adv, one, delta=delta)
        assert g.item() == pytest.approx(want, abs=1e-9)


@st.composite
def tokens(draw):
    n, L = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lp = -torch.rand(n, L, generator=g, dtype=torch.float64) * 4
    old = (lp + (torch.rand(n, L, generator=g, dtype=torch.float64) - 0.5) * 2).clamp(max=0)
    adv = torch.randn(n, L, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, L, generator=g) > 0.3).double()
    return lp, old, adv, mask


def unclipped(lp, old, adv, mask):
    return torch.where(mask > 0, -torch.exp(lp - old) * adv, torch.zeros_like(lp)), {}


@FAST
@given(tokens())
def test_dppo_with_the_widest_region_and_drpo_without_penalty_are_the_unclipped_gradient(t):
    lp, old, adv, mask = t
    want_loss, want_grad, _ = grad_of(unclipped, lp, old, adv, mask)
    for fn, opts in ((dppo, {"delta": 1.0}), (dppo, {"delta": 1.0, "direction": "both"}), (drpo, {"coef": 0.0})):
        loss, g, _ = grad_of(fn, lp, old, adv, mask, **opts)
        assert torch.allclose(loss, want_loss) and torch.allclose(g, want_grad), (fn.__name__, opts)


@FAST
@given(tokens(), st.floats(0.05, 1.0))
def test_drpo_gradient_keeps_the_policy_gradient_sign_inside_the_region(t, delta):
    lp, old, adv, mask = t
    _, g, _ = grad_of(drpo, lp, old, adv, mask, delta=delta)
    _, g_pg, _ = grad_of(unclipped, lp, old, adv, mask)
    shift = torch.exp(old) * (torch.exp(lp - old) - 1) * torch.sign(adv)
    inside, beyond = (shift < delta - 1e-9) & (mask > 0), (shift > delta + 1e-9) & (mask > 0) & (adv != 0)
    assert torch.all(g[inside] * g_pg[inside] >= 0)
    assert torch.all(g[beyond] * g_pg[beyond] < 0)  # corrective past the boundary


def test_both_are_registered_as_zero_at_zero_advantage_and_reject_bad_options():
    for name in ("dppo", "drpo"):
        assert POLICY_LOSSES.get(name).traits.zero_at_zero_advantage
        loss, g, _ = grad_of(POLICY_LOSSES.bind(name), LP, OLD, torch.zeros(1, 3, dtype=torch.float64), MASK)
        assert torch.all(loss == 0) and torch.all(g == 0)
        with pytest.raises(ConfigError, match="delta"):
            POLICY_LOSSES.bind(name, {"delta": 1.5})(LP, OLD, MASK, MASK)
    with pytest.raises(ConfigError, match="direction"):
        POLICY_LOSSES.bind("dppo", {"direction": "up"}, where="algo.policy_loss.options")
    with pytest.raises(ConfigError, match="coef"):
        drpo(LP, OLD, MASK, MASK, coef=-1.0)
