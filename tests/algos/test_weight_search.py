"""The consolidation rules of `upslope randopt` (registry `consolidate`): centred ranks, the ES step
and CoRP's weighted, compatibility-checked average, on hand-computed cases and as properties."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.weight_search import centered_ranks, compatibility, corp, es, zscores
from upslope.registry import CONSOLIDATORS


def test_centered_ranks_by_hand():
    assert centered_ranks(torch.tensor([3.0, 1.0, 2.0])).tolist() == [0.5, -0.5, 0.0]
    # ties share their mean rank: ranks 1.5, 1.5, 0 of 0..2
    assert centered_ranks(torch.tensor([1.0, 1.0, 0.0])).tolist() == [0.25, 0.25, -0.5]
    assert centered_ranks(torch.tensor([7.0])).tolist() == [0.0]


REWARDS = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # means 0.5, 0, 1, 0.5


def test_es_by_hand():
    # mean rewards 0.5, 0, 1, 0.5 -> ranks 1.5, 0, 3, 1.5 of 0..3 -> u = 0, -0.5, 0.5, 0; c = lr u / K
    coef, m = es(REWARDS, 1e-3, lr=0.4)
    assert coef.tolist() == pytest.approx([0.0, -0.05, 0.05, 0.0])
    assert m["es/shaped_abs_mean"] == pytest.approx(0.25)
    # z-scores: mean 0.5, population std sqrt(0.125)
    coef, _ = es(REWARDS, 1e-3, lr=0.4, shaping="zscore")
    z = 0.5 / 0.125 ** 0.5
    assert coef.tolist() == pytest.approx([0.0, -0.1 * z, 0.1 * z, 0.0])
    assert es(torch.ones(4, 3), 1e-3)[0].abs().sum() == 0  # equal rewards: no update
    assert zscores(torch.ones(3)).tolist() == [0.0, 0.0, 0.0]


CORP_REWARDS = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


def test_corp_by_hand():
    """Means 2/3, 2/3, 0, 1 (population mean 7/12): gains 1/12, 1/12, -7/12, 5/12. With elite 0.75 the
    best three are kept (3, then 0 and 1 by index). Per-prompt gains over the column means (3/4, 1/2,
    1/2): d0 = (1/4, 1/2, -1/2), d1 = (1/4, -1/2, 1/2), d3 = (1/4, 1/2, 1/2). Against the others' weighted
    sum, d0 and d1 have a negative cosine (-1/96 before normalising), so compatibility drops them; d3
    against (d0 + d1) / 12 = (1/24, 0, 0) has cosine (1/4) / (3/4) = 1/3. So only perturbation 3 is left."""
    sigma = 0.01
    coef, m = corp(CORP_REWARDS, sigma, elite=0.75)
    assert coef.tolist() == pytest.approx([0.0, 0.0, 0.0, sigma])
    assert m == {"corp/kept": 1.0, "corp/compat_mean": pytest.approx(1 / 3)}
    gains = CORP_REWARDS.double() - CORP_REWARDS.double().mean(0)
    w = torch.tensor([1 / 12, 1 / 12, 0.0, 5 / 12], dtype=torch.float64)
    assert compatibility(gains, w).tolist() == pytest.approx([0.0, 0.0, 1.0, 1 / 3])  # 1: not kept
    # without compatibility: weights proportional to the gains, 1/7, 1/7, 0, 5/7; scale 0.5 halves the step
    coef, m = corp(CORP_REWARDS, sigma, elite=0.75, compat=0.0, scale=0.5)
    assert coef.tolist() == pytest.approx([0.5 * sigma / 7, 0.5 * sigma / 7, 0.0, 0.5 * sigma * 5 / 7])
    assert m["corp/kept"] == 3.0
    # elite 0.5 keeps 3 and 0, whose gains agree (cosine 1/9 each): weights 1/6, 5/6
    coef, _ = corp(CORP_REWARDS, sigma, elite=0.5)
    assert coef.tolist() == pytest.approx([sigma / 6, 0.0, 0.0, sigma * 5 / 6])
    assert corp(torch.zeros(4, 3), sigma)[0].abs().sum() == 0  # nothing rewarded: no update


def test_registry_binds_and_rejects_options():
    assert CONSOLIDATORS.names() == ["corp", "es"]
    from upslope.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'elite'"):
        CONSOLIDATORS.bind("corp", {"elit": 0.3}, where="randopt.consolidate.options")


table = st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=3, max_size=3), min_size=2, max_size=8)


DYADIC_SCALE, DYADIC_SHIFT = st.sampled_from([0.5, 1.0, 2.0, 4.0]), st.sampled_from([-1.0, -0.5, 0.0, 0.25, 3.0])
# (exact in floating point: a shift like 0.1 would round two equal means apart and break their tie)


@settings(max_examples=60, deadline=None)
@given(table, DYADIC_SCALE, DYADIC_SHIFT)
def test_es_sums_to_zero_and_ignores_affine_rewards(rows, a, b):
    r = torch.tensor(rows)
    for shaping in ("ranks", "zscore"):
        coef, _ = es(r, 1e-3, lr=1.0, shaping=shaping)
        assert abs(float(coef.sum())) < 1e-9
        assert torch.allclose(coef, es(a * r + b, 1e-3, lr=1.0, shaping=shaping)[0], atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(table, st.floats(0.05, 1.0), st.sampled_from([0.0, 1.0, 2.0]), DYADIC_SHIFT)
def test_corp_is_a_weighted_average_of_its_elite(rows, elite, compat, b):
    r = torch.tensor(rows)
    sigma = 0.01
    coef, m = corp(r, sigma, elite=elite, compat=compat)
    assert (coef >= 0).all()
    total = float(coef.sum())
    assert total == pytest.approx(sigma) or total == 0.0
    assert (coef > 0).sum() <= max(1, round(elite * len(rows))) and m["corp/kept"] == float((coef > 0).sum())
    means = r.double().mean(1)
    assert all(means[k] > means.mean() + 1e-12 for k in torch.nonzero(coef > 0).flatten())  # only gains count
    assert torch.allclose(coef, corp(r + b, sigma, elite=elite, compat=compat)[0], atol=1e-9)
