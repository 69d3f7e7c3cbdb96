"""The conventions that differ between upslope, verl and TRL, each an option checked against a
hand-computed case: the std (population or n - 1, eps outside or inside the square root), what a
group of one gets, GSPO's clamp, REINFORCE++ returns across masked spans, and the log-ratio clamp
that keeps every KL estimator and policy loss finite."""
import math

import pytest
import torch
from algos_strategies import bind_loss, make_batch, sample_values

from upslope.algos.advantages import dr_grpo, gdpo, grpo, reinforce_pp, rloo
from upslope.algos.common import masked_whiten, reward_to_go
from upslope.algos.kl import k1, k2, k3
from upslope.algos.losses import gspo
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES

SQRT3 = math.sqrt(3.0)


def test_group_std_conventions_hand_example():
    b = make_batch([[1.0, 0.0, 0.0, 1.0]], comp_lens=[1] * 4)
    sign = torch.tensor([1.0, -1.0, -1.0, 1.0])
    # deviations +-0.5; sample var 1/3 (default), population var 1/4
    assert torch.allclose(sample_values(grpo(b), b), sign * SQRT3 / 2, atol=1e-5)
    assert torch.allclose(sample_values(grpo(b, unbiased=False), b), sign * 1.0, atol=1e-5)
    # eps 0.1 makes the two eps forms visibly different: 0.5 / (sqrt(1/3) + 0.1) vs 0.5 / sqrt(1/3 + 0.1)
    assert torch.allclose(sample_values(grpo(b, eps=0.1), b), sign * 0.7381705, atol=1e-6)
    assert torch.allclose(sample_values(grpo(b, eps=0.1, eps_in_sqrt=True), b), sign * 0.7595545, atol=1e-6)


def test_batch_whitening_conventions_hand_example():
    x = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    # on the mask: mean 0.4, squared deviations 2 * 0.36 + 3 * 0.16 = 1.2: population var 0.24 (default), n-1 var 0.3
    expect = torch.tensor([[0.6, 0.6, -0.4, -0.4, -0.4, 0.0]])
    assert torch.allclose(masked_whiten(x, mask, eps=0.0), expect / math.sqrt(0.24), atol=1e-6)
    assert torch.allclose(masked_whiten(x, mask, eps=0.0, unbiased=True), expect / math.sqrt(0.3), atol=1e-6)
    # verl's form: eps inside the square root: sqrt(0.24 + 0.01) = 0.5
    assert torch.allclose(masked_whiten(x, mask, eps=0.01, eps_in_sqrt=True), expect / 0.5, atol=1e-6)
    # the same options reach the estimators that whiten over the batch
    b = make_batch([[1.0], [0.0]], comp_lens=[2, 3])
    adv = reinforce_pp(b, unbiased=True, eps=0.0)
    assert torch.allclose(adv[0, 2:4], torch.full((2,), 0.6 / math.sqrt(0.3)), atol=1e-5)
    b.reward_components = {"a": torch.tensor([1.0, 0.0])}
    b.group_ids = torch.tensor([0, 0])  # one group of two: group-normalised a is [+1/sqrt2, -1/sqrt2] (n-1 std)
    # batch step over the 2 samples: mean 0, population std 1/sqrt2 -> +-1; n-1 std 1 -> +-1/sqrt2
    assert torch.allclose(sample_values(gdpo(b, eps=0.0), b), torch.tensor([1.0, -1.0]), atol=1e-6)
    assert torch.allclose(sample_values(gdpo(b, eps=0.0, batch_unbiased=True), b),
                          torch.tensor([1.0, -1.0]) / math.sqrt(2), atol=1e-6)


def test_singleton_group_conventions_hand_example():
    b = make_batch([[5.0], [1.0, 0.0]], comp_lens=[1, 1, 1])
    for fn in (grpo, dr_grpo, rloo):
        assert sample_values(fn(b), b)[0] == 0.0  # upslope: a lone sample has nothing to compare with
        assert sample_values(fn(b, singleton="raw"), b)[0] == 5.0  # verl: its raw reward
    assert torch.allclose(sample_values(rloo(b, singleton="raw"), b)[1:], torch.tensor([1.0, -1.0]))
    # REINFORCE++-baseline, verl's convention: the singleton's baseline is 0, so the returns are
    # [5, 0.5, -0.5]; population var 8.5 - (5/3)^2 = 5.7222, std 2.39212; not re-centred
    adv = sample_values(reinforce_pp(b, group_baseline=True, singleton="raw", eps=0.0), b)
    assert torch.allclose(adv, torch.tensor([2.0901990, 0.2090199, -0.2090199]), atol=1e-6)
    assert torch.all(reinforce_pp(b, group_baseline=True)[0] == 0)  # default: its own reward is the baseline


def test_gspo_clamp_conventions_hand_example():
    """Token log-ratios [30, 0] and [50, 0]: 'token' clamps 30 and 50 to 20 first (mean 10), 'sequence' clamps
    the means 15 and 25 to at most 20, 'none' keeps them. With A = -1 the loss on each token is the ratio."""
    lp = torch.zeros(2, 2, dtype=torch.float64)
    old = torch.tensor([[-30.0, 0.0], [-50.0, 0.0]], dtype=torch.float64)
    adv = -torch.ones(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2)
    expect = {"token": [10.0, 10.0], "sequence": [15.0, 20.0], "none": [15.0, 25.0]}
    for clamp, logs in expect.items():
        loss, _ = gspo(lp, old, adv, mask, clamp=clamp)
        assert torch.allclose(loss[:, 0], torch.tensor(logs, dtype=torch.float64).exp(), rtol=1e-12), clamp
    assert POLICY_LOSSES.get("gspo").options()["clamp"].default == "sequence"
    with pytest.raises(ConfigError, match="clamp"):
        POLICY_LOSSES.bind("gspo", {"clamp": "tokens"})
    # within the bound every form is the paper's: the same loss and gradient
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, -0.5]])
    grads = []
    for clamp in expect:
        lp.grad = None
        gspo(lp, old, -torch.ones(1, 3), torch.ones(1, 3), clamp=clamp)[0].sum().backward()
        grads.append(lp.grad.clone())
    assert all(torch.equal(g, grads[0]) for g in grads)


def test_reinforce_pp_returns_across_a_masked_span_hand_example():
    """Rewards [0, 2, (tool), 1], gamma 0.5. Carried (default): t1 = 2 + 0.5 * 1 = 2.5, t0 = 1.25.
    Reset at the masked span (verl): t1 = 2, t0 = 1: the first turn never sees the final reward."""
    r = torch.tensor([[0.0, 2.0, 0.0, 1.0]])
    m = torch.tensor([[1, 1, 0, 1]])
    assert torch.equal(reward_to_go(r, m, 0.5), torch.tensor([[1.25, 2.5, 0.0, 1.0]]))
    assert torch.equal(reward_to_go(r, m, 0.5, reset_at_masked=True), torch.tensor([[1.0, 2.0, 0.0, 1.0]]))
    # outcome reward only, two rows (rewards 1 and 0), the first with a tool span: with the reset the
    # first row's first turn gets return 0, the same as the failed row's, so whitening sets them equal
    b = make_batch([[1.0], [0.0]], comp_lens=[3, 3], prompt_lens=[1, 1], loss_masks=[[1, 0, 1], [1, 1, 1]])
    carried, reset = reinforce_pp(b), reinforce_pp(b, reset_at_masked=True)
    assert carried[0, 1] == carried[0, 3] > 0  # the whole successful trajectory is credited
    assert reset[0, 1] == reset[1, 1] < 0 < reset[0, 3]


@pytest.mark.parametrize("x", [1e4, -1e4, math.inf, -math.inf])
def test_kl_estimators_stay_finite_at_extreme_log_ratios(x):
    lp = torch.zeros(3, requires_grad=True)
    ref = torch.tensor([-x, 0.3, -0.2])  # log-ratio x on the first token
    for name in KL_ESTIMATORS.names():
        fn = KL_ESTIMATORS.bind(name)
        lp.grad = None
        out = fn(lp, ref)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(lp.grad).all(), (name, x)
    # the clamp at its default 20: k1 = +-20; k3 at x = -20 is e^20 - 21; both at x = +20: 19 and e^-20 + 19
    bound = 20.0 if x > 0 else -20.0
    assert k1(lp, ref)[0].item() == bound
    assert k2(lp, ref)[0].item() == 200.0
    assert k3(lp.double(), ref.double())[0].item() == pytest.approx(math.expm1(-bound) + bound)
    assert k1(lp, ref, max_log_ratio=5.0)[0].item() == bound / 4
    assert KL_ESTIMATORS.get("k3").options()["max_log_ratio"].default == 20.0


def test_kl_estimators_are_unchanged_within_the_bound_and_reject_a_bad_bound():
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert k3(lp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)
    assert k3(lp, ref, max_log_ratio=1.0).item() == pytest.approx(0.5 + math.log(2) - 1)  # |x| = 0.69 < 1
    assert k1(torch.tensor([-math.inf]), torch.tensor([-math.inf])).item() == 0.0  # inf - inf counts as 0
    with pytest.raises(ConfigError, match="max_log_ratio"):
        k3(lp, ref, max_log_ratio=0.0)


@pytest.mark.parametrize("x", [1e4, -1e4, math.inf, -math.inf])
def test_every_policy_loss_stays_finite_at_extreme_log_ratios(x):
    lp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0 - x, -0.4, -2.0]])  # log-ratio x on the first token
    mask = torch.ones(1, 3)
    for adv_sign in (1.0, -1.0):
        adv = torch.full((1, 3), adv_sign)
        for name in POLICY_LOSSES.names():
            options = [{"clamp": "sequence"}, {"clamp": "token"}] if name == "gspo" else [{}]
            for opts in options:
                lp.grad = None
                loss, metrics = bind_loss(name, opts)(lp, old, adv, mask)
                loss.sum().backward()
                assert torch.isfinite(loss).all() and torch.isfinite(lp.grad).all(), (name, opts, x)
                assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values()), (name, opts, x)


def test_options_are_declared_on_the_registered_plugins():
    """Each convention is an option of the plugin, with upslope's default."""
    defaults = {"grpo": {"unbiased": True, "eps_in_sqrt": False, "singleton": "zero"},
                "rloo": {"singleton": "zero"}, "dr_grpo": {"singleton": "zero"},
                "reinforce_pp": {"unbiased": False, "eps_in_sqrt": False, "reset_at_masked": False,
                                 "singleton": "zero"},
                "gae": {"unbiased": False, "eps_in_sqrt": False},
                "gdpo": {"unbiased": True, "batch_unbiased": False, "eps_in_sqrt": False, "singleton": "zero"}}
    for name, want in defaults.items():
        opts = ADVANTAGES.get(name).options()
        assert {k: opts[k].default for k in want} == want, name
    with pytest.raises(ConfigError, match="singleton"):
        ADVANTAGES.bind("grpo", {"singleton": "verl"}, where="algo.advantage.options")


@pytest.mark.parametrize("x", [1e4, -1e4, math.inf, -math.inf])
def test_the_sampled_distillation_loss_stays_finite_at_extreme_log_ratios(x):
    from upslope.algos.distill import DistillInputs, sampled_rkl

    lp = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-1.0 - x, -0.7]])  # student/teacher log-ratio x on the first token
    old = torch.tensor([[-1.0 + x, -0.5]])  # and an importance log-ratio -x there
    loss, _ = sampled_rkl(DistillInputs(lp, teacher, torch.ones(1, 2), old_logprobs=old))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(lp.grad).all()
    assert loss[0, 1].item() == pytest.approx(0.2)  # an ordinary token is untouched: k = -0.5 + 0.7, ratio 1
