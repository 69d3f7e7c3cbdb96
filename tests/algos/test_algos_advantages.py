"""Advantage estimators: hand-computed examples and properties over random batches."""
import math

import pytest
import torch
from algos_strategies import batches, bind_advantage, make_batch, sample_values
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.advantages import dr_grpo, gae, gae_advantages_and_returns, gdpo, grpo, reinforce_pp, rloo
from upslope.algos.common import group_moments, group_stats
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES

FAST = settings(max_examples=60, deadline=None)
SQRT3 = math.sqrt(3.0)


def test_group_stats_sample_and_population_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0])
    mean, std, count = group_stats(r, torch.tensor([0, 0, 0, 0, 1]))
    # group 0: mean 0.5, squared deviations 4 * 0.25 = 1; sample var 1/3, population var 1/4
    assert torch.allclose(mean, torch.tensor([0.5, 0.5, 0.5, 0.5, 2.0]))
    assert torch.allclose(std, torch.tensor([1 / SQRT3] * 4 + [0.0]))
    assert count.tolist() == [4, 4, 4, 4, 1]
    _, pop, _ = group_stats(r, torch.tensor([0, 0, 0, 0, 1]), unbiased=False)
    assert torch.allclose(pop[:4], torch.full((4,), 0.5))


def test_grpo_hand_example_and_broadcast():
    b = make_batch([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0]], comp_lens=[3, 2, 1, 2, 2, 2])
    adv = grpo(b)
    # +-0.5 / (1/sqrt(3)) = +-sqrt(3)/2 = +-0.8660; the constant group gets 0
    expect = torch.tensor([SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2, 0.0, 0.0])
    assert torch.allclose(sample_values(adv, b), expect, atol=1e-5)
    assert torch.equal(adv[0], torch.tensor([0, 0, 1, 1, 1]) * adv[0, 2])  # prompt 2 tokens, then 3 completion
    assert torch.all(adv[b.loss_mask == 0] == 0)


def test_grpo_without_std_is_dr_grpo_and_hand_example():
    b = make_batch([[1.0, 0.0, 0.0]], comp_lens=[1, 1, 1])
    assert torch.allclose(sample_values(dr_grpo(b), b), torch.tensor([2 / 3, -1 / 3, -1 / 3]))
    assert torch.equal(grpo(b, scale_by_std=False), dr_grpo(b))


def test_singleton_groups_get_zero():
    b = make_batch([[5.0], [-1.0]], comp_lens=[2, 2])
    for fn in (grpo, dr_grpo, rloo):
        assert torch.all(fn(b) == 0)


def test_rloo_hand_example():
    b = make_batch([[1.0, 0.0, 0.0, 1.0]], comp_lens=[1, 1, 1, 1])
    # 1 - (0+0+1)/3 = 2/3 ; 0 - (1+0+1)/3 = -2/3
    assert torch.allclose(sample_values(rloo(b), b), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_reinforce_pp_hand_example():
    b = make_batch([[1.0], [0.0]], comp_lens=[2, 3])
    # token values 1,1,0,0,0: mean 0.4, population std sqrt(0.24)
    s = math.sqrt(0.24)
    adv = reinforce_pp(b)
    assert torch.allclose(adv[0, 2:4], torch.full((2,), 0.6 / s), atol=1e-5)
    assert torch.allclose(adv[1, 2:5], torch.full((3,), -0.4 / s), atol=1e-5)
    # group baseline: one group -> +-0.5 on tokens 1,1,0,0,0: mean -0.1, std sqrt(0.24) again;
    # the group mean is the baseline, so the batch step divides by the std without re-centring
    b2 = make_batch([[1.0, 0.0]], comp_lens=[2, 3])
    adv2 = reinforce_pp(b2, group_baseline=True)
    assert torch.allclose(adv2[0, 2:4], torch.full((2,), 0.5 / s), atol=1e-5)
    assert torch.allclose(adv2[1, 2:5], torch.full((3,), -0.5 / s), atol=1e-5)


def test_gae_hand_example():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = gae_advantages_and_returns(r, v, m, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.3]]))
    # gamma 0.9, lam 0.5: deltas 0.04, 0.03, 0.3; gae 0.11425, 0.165, 0.3
    adv, ret = gae_advantages_and_returns(r, v, m, gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.11425, 0.165, 0.3]]))
    assert torch.allclose(ret, torch.tensor([[0.61425, 0.765, 1.0]]))


def test_gae_skips_untrained_tokens_and_uses_outcome_reward():
    b = make_batch([[1.0]], comp_lens=[3], prompt_lens=[1], loss_masks=[[1, 0, 1]])
    b.values = torch.tensor([[9.0, 0.5, 9.0, 0.7]])  # prompt and tool-token values must not matter
    adv, ret = gae(b, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.0, 0.5, 0.0, 0.3]]))
    assert torch.allclose(ret, torch.tensor([[0.0, 1.0, 0.0, 1.0]]))  # returns = adv + values, on trained tokens
    with pytest.raises(ConfigError):
        gae(make_batch([[1.0]], comp_lens=[1]))  # no values


def test_gdpo_hand_example():
    b = make_batch([[0.0] * 4], comp_lens=[1] * 4)
    b.reward_components = {"a": torch.tensor([1.0, 0.0, 0.0, 1.0]), "b": torch.tensor([0.0, 0.0, 0.0, 1.0])}
    # a -> +-sqrt(3)/2; b: mean 0.25, sample std 0.5 -> [-0.5, -0.5, -0.5, 1.5]; weights a 1, b 2
    h = SQRT3 / 2
    expect = torch.tensor([h - 1, -h - 1, -h - 1, h + 3])
    assert torch.allclose(sample_values(gdpo(b, weights={"b": 2.0}, batch_normalize=False), b), expect, atol=1e-5)
    norm = sample_values(gdpo(b, weights={"b": 2.0}), b)
    assert torch.allclose(norm, (expect - expect.mean()) / expect.std(unbiased=False), atol=1e-4)
    with pytest.raises(ConfigError):
        gdpo(b, weights={"c": 1.0})


@FAST
@given(batches(full_mask=True))
def test_group_advantages_have_zero_mean_per_group(b):
    for fn in (grpo, dr_grpo, rloo):
        a = sample_values(fn(b), b)
        for g in b.group_ids.unique():
            assert abs(float(a[b.group_ids == g].sum())) < 1e-3


@FAST
@given(batches(full_mask=True))
def test_rloo_equals_naive_leave_one_out(b):
    r, gid = b.rewards.tolist(), b.group_ids.tolist()
    naive = []
    for i in range(len(r)):
        others = [r[j] for j in range(len(r)) if gid[j] == gid[i] and j != i]
        naive.append(r[i] - sum(others) / len(others) if others else 0.0)
    assert torch.allclose(sample_values(rloo(b), b), torch.tensor(naive), atol=1e-5)


@FAST
@given(batches(), st.integers(0, 2**31 - 1))
def test_every_estimator_is_zero_off_the_loss_mask(b, seed):
    g = torch.Generator().manual_seed(seed)
    b.values = torch.randn(b.input_ids.shape, generator=g)
    b.reward_components = {"x": b.rewards * 2, "y": torch.randn(b.size, generator=g)}
    for name in ADVANTAGES.names():
        adv = bind_advantage(name, b, g)(b)
        if ADVANTAGES.get(name).traits.critic:
            adv, ret = adv
            assert torch.all(ret[b.loss_mask == 0] == 0) and torch.isfinite(ret).all(), name
        assert adv.dtype == torch.float32, name
        assert adv.shape == b.input_ids.shape
        assert torch.all(adv[b.loss_mask == 0] == 0), name
        assert torch.isfinite(adv).all(), name


@FAST
@given(batches(), st.integers(0, 2**31 - 1))
def test_gae_with_unit_gamma_lambda_is_returns_minus_values(b, seed):
    g = torch.Generator().manual_seed(seed)
    b.values = torch.randn(b.input_ids.shape, generator=g)
    b.token_rewards = torch.randn(b.input_ids.shape, generator=g) * b.loss_mask
    adv, ret = gae_advantages_and_returns(b.token_rewards, b.values, b.loss_mask, 1.0, 1.0)
    mc = torch.zeros_like(b.values)  # naive Monte-Carlo return: sum of later trained-token rewards
    for i in range(b.size):
        for t in range(b.input_ids.shape[1]):
            if b.loss_mask[i, t] > 0:
                mc[i, t] = b.token_rewards[i, t:].sum()
    on = b.loss_mask > 0
    assert torch.allclose(ret[on], mc[on], atol=1e-4)
    assert torch.allclose(adv[on], (mc - b.values)[on], atol=1e-4)
    assert torch.allclose(gae(b, gamma=1.0, lam=1.0, whiten=False)[0], adv)


@FAST
@given(batches())
def test_reinforce_pp_is_whitened_over_valid_tokens(b):
    on = b.loss_mask > 0
    ret = b.rewards.double()[:, None].expand(b.input_ids.shape)[on]  # gamma 1, outcome reward: r on every token
    vals = reinforce_pp(b)[on]
    if vals.numel() > 1 and ret.std() > 1e-2:  # a (near-)constant input whitens to ~0 by design (eps)
        assert abs(float(vals.mean())) < 1e-4
        assert abs(float(vals.std(unbiased=False)) - 1) < 1e-3
    # with the group baseline: (r - group mean) / batch std, not re-centred; tied groups exactly 0
    mean, _, _, tied = group_moments(b.rewards, b.group_ids)
    raw = (b.rewards.double() - mean)[:, None].expand(b.input_ids.shape)[on]
    vals = reinforce_pp(b, group_baseline=True)[on]
    if raw.numel() > 1 and raw.std() > 1e-2:
        assert torch.allclose(vals.double(), raw / (raw.std(unbiased=False) + 1e-6), atol=1e-5)
    assert torch.all(vals[tied[:, None].expand(b.input_ids.shape)[on]] == 0)


@FAST
@given(batches(full_mask=True), st.integers(0, 2**31 - 1))
def test_gdpo_normalises_each_component(b, seed):
    g = torch.Generator().manual_seed(seed)
    # small integer components: constant groups centre to exactly 0, others have std >= 0.5 >> eps
    a, c = (torch.randint(0, 4, (b.size,), generator=g).float() for _ in range(2))
    b.reward_components = {"a": a, "c": c}
    base = gdpo(b, batch_normalize=False)
    # a positive affine change of one component changes nothing (up to eps): each is normalised in its group
    b.reward_components = {"a": a * 100 + 7, "c": c}
    assert torch.allclose(gdpo(b, batch_normalize=False), base, atol=1e-4)
    # one component, no batch normalisation: exactly GRPO on that component
    b.reward_components = {"only": b.rewards}
    assert torch.allclose(gdpo(b, batch_normalize=False), grpo(b), atol=1e-6)
