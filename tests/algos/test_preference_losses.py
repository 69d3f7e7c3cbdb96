"""Preference losses (DPO sigmoid, IPO, SimPO): hand-computed values and properties."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.preference import PairLogps, bradley_terry_loss, ipo, preference_metrics, sigmoid, simpo
from upslope.errors import ConfigError
from upslope.registry import PREFERENCE_LOSSES

FAST = settings(max_examples=80, deadline=None)
LOGP = st.floats(-60, 0, allow_nan=False, allow_infinity=False)
TOKENS = st.integers(1, 40)
BETA = st.floats(0.01, 5.0)
EPS = st.floats(0.0, 0.49)


def pairs(chosen, rejected, ct=1, rt=1, grad=False) -> PairLogps:
    t = lambda x: torch.tensor([float(x)], dtype=torch.float64, requires_grad=grad)  # noqa: E731
    return PairLogps(t(chosen), t(rejected), torch.tensor([float(ct)]), torch.tensor([float(rt)]))


def test_sigmoid_hand_example():
    # h = 0.5 * ((-1 - -2) - (-3 - -2)) = 1 ; -log sigmoid(1) = log(1 + e^-1)
    out = sigmoid(pairs(-1, -3), pairs(-2, -2), beta=0.5)
    assert out.loss.item() == pytest.approx(math.log1p(math.exp(-1)))
    assert (out.chosen_reward.item(), out.rejected_reward.item()) == pytest.approx((0.5, -0.5))
    smoothed = sigmoid(pairs(-1, -3), pairs(-2, -2), beta=0.5, label_smoothing=0.1)
    assert smoothed.loss.item() == pytest.approx(0.9 * math.log1p(math.exp(-1)) + 0.1 * math.log1p(math.e))


def test_ipo_hand_example_uses_length_averaged_logprobs():
    # chosen: policy -2/2 tokens = -1, reference -4/2 = -2 -> 1 ; rejected: -3/3 vs -3/3 -> 0 ; h = 1
    out = ipo(pairs(-2, -3, 2, 3), pairs(-4, -3, 2, 3), beta=0.25)
    assert out.loss.item() == pytest.approx((1 - 1 / (2 * 0.25)) ** 2)  # (1 - 2)^2 = 1
    assert (out.chosen_reward.item(), out.rejected_reward.item()) == pytest.approx((0.25, 0.0))


def test_simpo_hand_example_is_reference_free():
    # avg chosen -2/4 = -0.5, avg rejected -6/3 = -2 ; h = 2 * (-0.5 + 2) - 1 = 2
    out = simpo(pairs(-2, -6, 4, 3), None, beta=2.0, gamma=1.0)
    assert out.loss.item() == pytest.approx(math.log1p(math.exp(-2)))
    assert (out.chosen_reward.item(), out.rejected_reward.item()) == pytest.approx((-1.0, -4.0))
    assert simpo(pairs(-2, -6, 4, 3), pairs(-9, 0, 4, 3), beta=2.0, gamma=1.0).loss.item() == out.loss.item()


def test_losses_needing_a_reference_say_so():
    assert PREFERENCE_LOSSES.get("sigmoid").traits.reference and PREFERENCE_LOSSES.get("ipo").traits.reference
    assert not PREFERENCE_LOSSES.get("simpo").traits.reference
    with pytest.raises(ConfigError, match="needs reference"):
        sigmoid(pairs(-1, -2), None)


@pytest.mark.parametrize("name, options, expected", [
    ("sigmoid", {"beta": 0}, "beta: Input should be greater than 0"),
    ("sigmoid", {"label_smoothing": 0.5}, "label_smoothing: Input should be less than 0.5"),
    ("ipo", {"label_smoothing": 0.1}, "unknown option for preference_loss 'ipo'"),
    ("simpo", {"gama": 1.0}, "did you mean 'gamma'"),
])
def test_bad_options_are_config_errors(name, options, expected):
    with pytest.raises(ConfigError, match=expected):
        PREFERENCE_LOSSES.bind(name, options, where="dpo.loss.options")


@FAST
@given(LOGP, LOGP, TOKENS, TOKENS, BETA, EPS)
def test_dpo_is_log2_when_policy_is_reference(c, r, ct, rt, beta, eps):
    p = pairs(c, r, ct, rt)
    out = sigmoid(p, p, beta=beta, label_smoothing=eps)
    assert out.loss.item() == pytest.approx(math.log(2))
    assert out.chosen_reward.item() == 0 and out.rejected_reward.item() == 0


@FAST
@given(LOGP, LOGP, LOGP, LOGP, BETA, EPS)
def test_dpo_swapping_chosen_and_rejected_mirrors_the_loss(c, r, rc, rr, beta, eps):
    """l(h) - l(-h) = -(1 - 2 eps) h, for h the scaled log-ratio difference."""
    out = sigmoid(pairs(c, r), pairs(rc, rr), beta=beta, label_smoothing=eps)
    swapped = sigmoid(pairs(r, c), pairs(rr, rc), beta=beta, label_smoothing=eps)
    h = beta * ((c - rc) - (r - rr))
    assert out.loss.item() - swapped.loss.item() == pytest.approx(-(1 - 2 * eps) * h, abs=1e-9)
    assert out.chosen_reward.item() == pytest.approx(swapped.rejected_reward.item())


@FAST
@given(LOGP, LOGP, TOKENS, TOKENS, BETA)
def test_ipo_minimum_is_at_half_inverse_beta(rc, rr, ct, rt, beta):
    """Policy log-probs chosen so that h = 1/(2 beta): loss 0 with zero gradient; elsewhere > 0."""
    target = 1 / (2 * beta)
    c = (rc / ct + target) * ct  # chosen log-ratio = target, rejected log-ratio = 0
    p = pairs(c, rr, ct, rt, grad=True)
    out = ipo(p, pairs(rc, rr, ct, rt), beta=beta)
    out.loss.sum().backward()
    assert out.loss.item() == pytest.approx(0, abs=1e-9)
    assert p.chosen.grad.item() == pytest.approx(0, abs=1e-6) and p.rejected.grad.item() == pytest.approx(0, abs=1e-6)
    off = ipo(pairs(c + 0.5 * ct, rr, ct, rt), pairs(rc, rr, ct, rt), beta=beta)
    assert off.loss.item() == pytest.approx(0.25)


@FAST
@given(LOGP, LOGP, LOGP, LOGP, TOKENS, TOKENS, BETA, EPS, st.sampled_from(["sigmoid", "ipo", "simpo"]))
def test_gradients_push_chosen_up_and_rejected_down(c, r, rc, rr, ct, rt, beta, eps, name):
    """Below its optimum h* each loss raises the chosen log-prob and lowers the rejected one
    (above it, the reverse). h* is +inf for plain DPO/SimPO, log((1 - eps)/eps) with label
    smoothing eps (conservative DPO), and 1/(2 beta) for IPO."""
    p = pairs(c, r, ct, rt, grad=True)
    ref = pairs(rc, rr, ct, rt)
    best = math.log((1 - eps) / eps) if eps > 0 else math.inf
    if name == "sigmoid":
        out = sigmoid(p, ref, beta=beta, label_smoothing=eps)
        h = beta * ((c - rc) - (r - rr))
    elif name == "simpo":
        out = simpo(p, None, beta=beta, gamma=0.5, label_smoothing=eps)
        h = beta * (c / ct - r / rt) - 0.5
    else:
        out = ipo(p, ref, beta=beta)
        h, best = (c / ct - rc / ct) - (r / rt - rr / rt), 1 / (2 * beta)
    if abs(h - best) < 1e-6:
        return
    sign = 1.0 if h < best else -1.0
    out.loss.sum().backward()
    gc, gr = p.chosen.grad.item(), p.rejected.grad.item()
    assert sign * gc < 0 < sign * gr or gc == 0 == gr  # (0 only where the sigmoid saturates in float64)


@FAST
@given(LOGP, LOGP, TOKENS, TOKENS, st.integers(2, 5), BETA)
def test_simpo_and_ipo_depend_on_average_logprobs_only(c, r, ct, rt, k, beta):
    """Scaling a completion's summed log-prob and its length together leaves them unchanged."""
    a = simpo(pairs(c, r, ct, rt), None, beta=beta, gamma=0.3).loss.item()
    b = simpo(pairs(k * c, k * r, k * ct, k * rt), None, beta=beta, gamma=0.3).loss.item()
    assert a == pytest.approx(b)
    ref = pairs(c / 2, r / 3, ct, rt)
    kref = pairs(k * c / 2, k * r / 3, k * ct, k * rt)
    assert ipo(pairs(c, r, ct, rt), ref, beta=beta).loss.item() == pytest.approx(
        ipo(pairs(k * c, k * r, k * ct, k * rt), kref, beta=beta).loss.item())


@FAST
@given(st.floats(-30, 30), EPS)
def test_bradley_terry_loss_is_stable_and_positive(h, eps):
    x = torch.tensor([h], dtype=torch.float64)
    loss = bradley_terry_loss(x, eps).item()
    assert math.isfinite(loss) and loss > 0
    assert loss == pytest.approx((1 - eps) * math.log1p(math.exp(-h)) + eps * math.log1p(math.exp(h)), rel=1e-9)


def test_preference_metrics_are_per_pair_means():
    out = [sigmoid(PairLogps(torch.tensor([-1.0, -5.0]), torch.tensor([-3.0, -2.0]), torch.ones(2), torch.ones(2)),
                   PairLogps(torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0]), torch.ones(2), torch.ones(2)),
                   beta=1.0)]
    pol = [PairLogps(torch.tensor([-1.0, -5.0]), torch.tensor([-3.0, -2.0]), torch.ones(2), torch.ones(2))]
    m = preference_metrics(out, pol)
    # rewards chosen (1, -3), rejected (-1, 0): margins 2 and -3
    assert m["pref/chosen_reward"] == pytest.approx(-1.0) and m["pref/rejected_reward"] == pytest.approx(-0.5)
    assert m["pref/margin"] == pytest.approx(-0.5) and m["pref/accuracy"] == pytest.approx(0.5)
    assert m["pref/logp_chosen"] == pytest.approx(-3.0) and m["pref/logp_rejected"] == pytest.approx(-2.5)
