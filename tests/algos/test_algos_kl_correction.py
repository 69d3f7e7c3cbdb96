"""KL estimators, the adaptive KL controller, and train/inference mismatch correction."""
import math

import pytest
import torch
from algos_strategies import token_tensors
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.correction import importance_correction
from upslope.algos.kl import AdaptiveKLController, FixedKLController, k1, k2, k3, kl_in_reward
from upslope.errors import ConfigError

FAST = settings(max_examples=60, deadline=None)


def test_kl_estimators_hand_example():
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert k1(lp, ref).item() == pytest.approx(math.log(2))  # 0.6931
    assert k2(lp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)  # 0.2402
    assert k3(lp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)  # exp(log .5) - log .5 - 1 = 0.1931


def test_k1_and_k3_are_unbiased_for_kl_on_a_categorical():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    kl = float((p * (p / q).log()).sum())  # 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3) = 0.21628
    assert kl == pytest.approx(0.5 * math.log(2.5) + 0.3 * math.log(0.6) + 0.2 * math.log(2 / 3))
    # exact expectation under p
    assert float((p * k1(p.log(), q.log())).sum()) == pytest.approx(kl)
    assert float((p * k3(p.log(), q.log())).sum()) == pytest.approx(kl)
    # Monte-Carlo mean from samples of p
    idx = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    assert float(k1(p.log()[idx], q.log()[idx]).mean()) == pytest.approx(kl, abs=0.01)
    assert float(k3(p.log()[idx], q.log()[idx]).mean()) == pytest.approx(kl, abs=0.01)


@FAST
@given(token_tensors())
def test_k3_and_k2_are_non_negative(t):
    lp, old, _, _ = t
    for x in (old, old + 1e-9, lp * 5):
        assert torch.all(k3(lp, x) >= 0) and torch.all(k2(lp, x) >= 0)


def test_kl_gradients_do_not_reach_the_reference():
    lp = torch.zeros(3, requires_grad=True)
    ref = torch.tensor([0.1, -0.2, 0.3], requires_grad=True)
    for fn in (k1, k2, k3):
        fn(lp, ref).sum().backward()
    assert ref.grad is None and lp.grad is not None


def test_kl_in_reward_hand_example():
    tr = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    kl = torch.tensor([[5.0, 0.5, 1.0, 9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    assert torch.allclose(kl_in_reward(tr, kl, 0.1, mask), torch.tensor([[0.0, -0.05, 0.9, 0.0]]))


def test_adaptive_kl_controller():
    c = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10_000)
    assert c.update(12.0, 100) == pytest.approx(0.1 * (1 + 0.2 * 100 / 10_000))  # error 1 clipped to 0.2
    c = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10_000)
    assert c.update(3.0, 100) == pytest.approx(0.1 * (1 - 0.2 * 0.01))  # error -0.5 clipped to -0.2
    c = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10_000)
    assert c.update(6.6, 1000) == pytest.approx(0.1 * (1 + 0.1 * 0.1))  # error 0.1, unclipped
    assert FixedKLController(0.05).update(100.0, 10) == 0.05
    with pytest.raises(ConfigError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


def test_token_level_tis_hand_example():
    old = torch.log(torch.tensor([[3.0, 0.5, 1.0, 7.0]]))
    sampler = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, m, metrics = importance_correction(old, sampler, mask, cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0, 0.0]]))  # min(rho, 2); 0 off-mask
    assert torch.equal(m, mask)
    assert metrics["capped_frac"].item() == pytest.approx(1 / 3)
    assert metrics["masked_frac"].item() == 0
    assert metrics["mismatch_abs"].item() == pytest.approx((math.log(3) + math.log(2)) / 3)
    w, m, metrics = importance_correction(old, sampler, mask, cap=2.0, mask_low=0.6)
    assert torch.allclose(w, torch.tensor([[2.0, 0.0, 1.0, 0.0]]))
    assert torch.equal(m, torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    assert metrics["masked_frac"].item() == pytest.approx(1 / 3)


def test_sequence_level_tis_hand_example():
    old = torch.log(torch.tensor([[1.5, 1.5, 1.0], [0.5, 1.0, 9.0]]))
    sampler = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # sequence: product of ratios -> 2.25 (capped to 2) and 0.5
    w, m, metrics = importance_correction(old, sampler, mask, level="sequence", cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 0.0], [0.5, 0.5, 0.0]]))
    assert metrics["capped_frac"].item() == pytest.approx(0.5)  # one row of two
    # geometric: exp(mean log ratio) -> 1.5 and sqrt(0.5)
    w, m, _ = importance_correction(old, sampler, mask, level="geometric", cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 0.0], [0.5 ** 0.5] * 2 + [0.0]]))
    # masking a whole row whose ratio is below 0.6
    w, m, metrics = importance_correction(old, sampler, mask, level="sequence", mask_low=0.6)
    assert torch.equal(m, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert metrics["masked_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ConfigError):
        importance_correction(old, sampler, mask, level="seq")


@FAST
@given(token_tensors(), st.sampled_from(["token", "sequence", "geometric"]), st.floats(1.0, 5.0),
       st.one_of(st.none(), st.floats(0.1, 0.9)), st.one_of(st.none(), st.floats(1.1, 10.0)))
def test_tis_weights_are_capped_detached_and_masked(t, level, cap, lo, hi):
    lp, old, _, mask = t
    lp = lp.clone().requires_grad_(True)  # stands in for learner log-probs that carry a graph
    w, m, metrics = importance_correction(lp, old, mask, level=level, cap=cap, mask_low=lo, mask_high=hi)
    assert not w.requires_grad
    assert torch.all(w <= cap + 1e-9) and torch.all(w >= 0)
    assert torch.all(w[m == 0] == 0)
    assert torch.all(m <= mask)  # only ever removes tokens
    rho = torch.exp((lp.detach() - old) * (mask > 0))
    if level == "token":
        keep = m > 0
        assert torch.allclose(w[keep], rho.clamp(max=cap)[keep])
    else:  # a row is kept or dropped whole, and its weight is constant along it
        for i in range(mask.shape[0]):
            on = mask[i] > 0
            assert torch.all(m[i][on] == m[i][on][0]) if on.any() else True
            assert torch.all(w[i][on] == w[i][on][0]) if on.any() else True
    for v in metrics.values():
        assert 0 <= float(v) and math.isfinite(float(v))


def test_mismatch_kl_hand_example_and_never_nan():
    """KL(sampler || learner) per trained token as k3 = r - 1 - log r, r = p_learner / p_sampler; both -inf: 0."""
    from upslope.algos.terms import mismatch_kl

    inf = float("inf")
    learner, sampler = torch.tensor([[-1.0, -2.0, -inf, -0.5]]), torch.tensor([[-1.5, -1.0, -inf, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    k3 = [math.exp(d) - 1 - d for d in (0.5, -1.0, 0.0)]
    assert mismatch_kl(learner, sampler, mask) == pytest.approx(sum(k3) / 3)


def test_the_load_balance_term_adds_coef_times_the_routers_loss_at_every_trained_token():
    from upslope.algos.terms import LoadBalance, LossInputs

    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    aux = torch.tensor(1.25, requires_grad=True)
    zeros = torch.zeros(2, 3)
    out = LoadBalance(coef=0.2)(LossInputs(logprobs=zeros, old_logprobs=zeros, sampler_logprobs=zeros,
                                           advantages=zeros, mask=mask, router_aux_loss=aux))
    assert torch.equal(out.add.detach(), 0.25 * mask) and out.metrics == {"router/load_balance": 1.25}
    out.add.sum().backward()
    assert float(aux.grad) == pytest.approx(0.2 * 3)
