"""Tied groups: a group whose rewards are all equal gets exactly 0 advantage from every group
estimator, whatever the value (non-dyadic ones included), mixed with non-tied groups; and the
invariants of the group estimators (scale invariance, the RLOO identity)."""
import torch
from algos_strategies import make_batch, sample_values
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.advantages import dr_grpo, gae, gdpo, grpo, reinforce_pp, rloo
from upslope.algos.combiners import group_normalized_sum
from upslope.algos.common import group_normalize, masked_whiten

FAST = settings(max_examples=80, deadline=None)

# values that float32/float64 cannot represent exactly (and a few that they can)
NON_DYADIC = st.sampled_from([0.3, 1.1, 97.3, 1e-7, -0.7, 1 / 3, 0.1, 2.2e5, -13.37, 99.99, 0.0, 1.0])
TIE_VALUE = st.one_of(NON_DYADIC, st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False))
VARIED = st.integers(0, 3).map(float)  # non-tied groups: small integers, so the group std is >= 0.4 >> eps


@st.composite
def mixed_groups(draw, min_size: int = 2) -> list[list[float]]:
    """Random groups, about half of them tied (one value repeated), the others small integers."""
    groups = []
    for _ in range(draw(st.integers(1, 6))):
        size = draw(st.integers(min_size, 9))
        if draw(st.booleans()):
            groups.append([draw(TIE_VALUE)] * size)
        else:
            groups.append(draw(st.lists(VARIED, min_size=size, max_size=size)))
    return groups


def _batch(groups: list[list[float]], dtype: torch.dtype) -> tuple:
    """A batch of these groups (rewards in `dtype`) and which rows belong to a tied group."""
    n = sum(len(g) for g in groups)
    b = make_batch(groups, comp_lens=[1 + i % 3 for i in range(n)])
    b.rewards = torch.tensor([r for g in groups for r in g], dtype=dtype)
    return b, torch.tensor([len(set(g)) == 1 for g in groups for _ in g])


def test_the_reported_cases_are_exactly_zero():
    """The issue's reproductions: 8 x 0.3 gave 0.0289, 16 x 1.1 gave -0.106, rewards near 100 gave 0.91."""
    for value, size in ((0.3, 8), (1.1, 16), (97.3, 8), (99.99, 5)):
        out = group_normalize(torch.full((size,), value), torch.zeros(size, dtype=torch.long))
        assert out.dtype == torch.float32 and torch.equal(out, torch.zeros(size)), (value, size)
        bare = group_normalize(torch.full((size,), value), torch.zeros(size, dtype=torch.long), eps=0.0)
        assert torch.equal(bare, torch.zeros(size)), (value, size)  # 0 / 0 without eps: still exactly 0


@FAST
@given(mixed_groups(), st.sampled_from([torch.float32, torch.float64]))
def test_tied_groups_get_exactly_zero_from_every_group_estimator(groups, dtype):
    b, tied = _batch(groups, dtype)
    on_tied = tied[:, None] & (b.loss_mask > 0)
    estimators = {
        "grpo": lambda: grpo(b),
        "grpo population, eps in sqrt": lambda: grpo(b, unbiased=False, eps_in_sqrt=True),
        "grpo no std": lambda: grpo(b, scale_by_std=False),
        "dr_grpo": lambda: dr_grpo(b),
        "rloo": lambda: rloo(b),
        "reinforce_pp baseline": lambda: reinforce_pp(b, group_baseline=True),
        "reinforce_pp baseline gamma 0.9": lambda: reinforce_pp(b, group_baseline=True, gamma=0.9),
        "reinforce_pp baseline verl form": lambda: reinforce_pp(b, group_baseline=True, unbiased=True,
                                                                eps_in_sqrt=True),
    }
    for name, fn in estimators.items():
        adv = fn()
        assert adv.dtype == torch.float32, name
        assert torch.all(adv[on_tied] == 0), name
        assert torch.isfinite(adv).all(), name
        if not bool(tied.all()) and name != "reinforce_pp baseline gamma 0.9":
            assert bool((adv[~tied[:, None] & (b.loss_mask > 0)] != 0).any()), name  # the others carry signal


@FAST
@given(mixed_groups(), st.data(), st.booleans())
def test_gdpo_gives_exactly_zero_to_groups_tied_on_every_component(groups, data, batch_normalize):
    b, tied = _batch(groups, torch.float32)
    other = []  # a second component: another tied value where the rewards are tied, else free
    for g in groups:
        other += [data.draw(NON_DYADIC)] * len(g) if len(set(g)) == 1 else data.draw(
            st.lists(VARIED, min_size=len(g), max_size=len(g)))
    b.reward_components = {"a": b.rewards.clone(), "b": torch.tensor(other)}
    adv = sample_values(gdpo(b, weights={"b": 0.3}, batch_normalize=batch_normalize), b)
    assert torch.all(adv[tied] == 0)
    assert torch.isfinite(adv).all()
    assert torch.all(group_normalized_sum(b.reward_components, b.group_ids)[tied] == 0)


@FAST
@given(TIE_VALUE, st.integers(1, 4), st.integers(1, 5), st.sampled_from([torch.float32, torch.float64]))
def test_batch_whitening_of_equal_values_is_exactly_zero(value, rows, length, dtype):
    x = torch.full((rows, length), value, dtype=dtype)
    mask = torch.ones(rows, length)
    mask[0, 0] = 0  # an entry outside the mask may differ
    x[0, 0] = value + 5.0
    for kw in ({}, {"unbiased": True, "eps_in_sqrt": True}, {"shift_mean": False}):
        out = masked_whiten(x, mask, **kw)
        assert torch.equal(out, torch.zeros_like(out)), kw
        assert out.dtype == dtype
    # the estimators that whiten over the batch: REINFORCE++ (every row the same reward) and GAE
    b = make_batch([[value]] * rows, comp_lens=[length] * rows)
    b.rewards = torch.full((rows,), value, dtype=dtype)
    assert torch.all(reinforce_pp(b) == 0)
    b.values = torch.zeros(b.input_ids.shape)
    b.token_rewards = torch.full(b.input_ids.shape, value) * b.loss_mask
    adv, _ = gae(b, gamma=1.0, lam=0.0)  # delta = r + V' - V = r on every trained token: all equal
    assert torch.all(adv == 0)


@FAST
@given(mixed_groups(), st.floats(0.5, 100), st.floats(-50, 50))
def test_group_estimators_under_an_affine_change_of_the_rewards(groups, scale, shift):
    """GRPO is invariant to r -> a r + c (a > 0); Dr. GRPO and RLOO ignore c and scale with a."""
    b, tied = _batch(groups, torch.float64)
    base, d0, r0 = grpo(b, eps=1e-9), dr_grpo(b), rloo(b)
    b.rewards = b.rewards * scale + shift
    assert torch.allclose(grpo(b, eps=1e-9), base, atol=1e-5)
    assert torch.allclose(dr_grpo(b), d0 * scale, rtol=1e-5, atol=1e-4)
    assert torch.allclose(rloo(b), r0 * scale, rtol=1e-5, atol=1e-4)
    for fn in (grpo, dr_grpo, rloo):
        assert torch.all(fn(b)[tied] == 0)


@FAST
@given(mixed_groups(min_size=1))
def test_rloo_is_dr_grpo_times_n_over_n_minus_1(groups):
    """r_i - (S - r_i) / (n - 1) = n / (n - 1) * (r_i - S / n); singletons get 0 from both."""
    b, _ = _batch(groups, torch.float64)
    n = torch.tensor([len(g) for g in groups for _ in g], dtype=torch.float64)
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    expect = factor * sample_values(dr_grpo(b), b).double()
    assert torch.allclose(sample_values(rloo(b), b).double(), expect, atol=1e-5)
