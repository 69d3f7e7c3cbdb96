"""SAERL against hand-made cases: the SAE fit (sparse, reconstructing, seeded), the data plan it gives
(difficulty rank, quality filter), and the sampler's moderate cluster mixing and easy-to-hard curriculum."""
from __future__ import annotations

import pytest
import torch

from upslope.data.saerl import DataPlan, SaerlSampler, SparseCodes, data_plan, fit_sae
from upslope.errors import ConfigError
from upslope.registry import SAMPLERS


def sparse_features() -> torch.Tensor:
    """60 rows in 8 dimensions, each a non-negative mix of at most two of three directions plus small noise."""
    g = torch.Generator().manual_seed(0)
    dirs = torch.randn(3, 8, generator=g)
    weights = torch.rand(60, 3, generator=g) * (torch.rand(60, 3, generator=g) < 0.5)
    return weights @ dirs + 0.01 * torch.randn(60, 8, generator=g)


def test_the_sae_reconstructs_sparsely_and_is_seeded():
    x = sparse_features()
    dense = fit_sae(x, latents=16, l1=0.0, steps=300, seed=0)
    sparse = fit_sae(x, latents=16, l1=0.1, steps=300, seed=0)
    assert float(dense.error.mean()) < 0.05  # the standardised rows have variance 1 a dimension
    assert float(sparse.error.mean()) < 0.5 and bool((sparse.codes >= 0).all())
    assert float((sparse.codes > 0).sum(1).float().mean()) < float((dense.codes > 0).sum(1).float().mean())
    again = fit_sae(x, latents=16, l1=0.1, steps=300, seed=0)
    assert torch.equal(again.codes, sparse.codes)


def test_the_data_plan_by_hand():
    """Active latents 1, 2, 1, 3: prompts 0 and 2 tie on one and prompt 2's smaller code sum makes it the
    easiest; the worst-reconstructed quarter (prompt 1, error 0.9) is dropped."""
    codes = torch.tensor([[1.0, 0, 0], [1.0, 1.0, 0], [0.5, 0, 0], [1.0, 1.0, 1.0]])
    plan = data_plan(SparseCodes(codes, torch.tensor([0.1, 0.9, 0.2, 0.3])), clusters=2, drop_share=0.25, seed=0)
    assert plan.rank.tolist() == [1, 2, 0, 3] and plan.keep.tolist() == [True, False, True, True]
    assert data_plan(SparseCodes(codes, torch.zeros(4)), 2, drop_share=1.0, seed=0).keep.sum() == 1  # one stays


def sampler(**options) -> SaerlSampler:
    """Six prompts in three clusters of two, ranked easiest first by index, all kept."""
    s = SaerlSampler(6, seed=0, **options)
    s.plan = DataPlan(torch.tensor([0, 0, 1, 1, 2, 2]), torch.arange(6), torch.ones(6, dtype=torch.bool))
    return s


def clusters_of(picks: list[int]) -> list[int]:
    return sorted(p // 2 for p in picks)


def test_a_batch_mixes_mix_clusters_and_the_next_batch_moves_on():
    s = sampler(start=1.0, mix=2)
    first = s.next(4)
    a, b = sorted(set(clusters_of(first)))
    assert clusters_of(first) == [a, a, b, b]  # both prompts of two clusters, none of the third
    s.update(first, torch.zeros(4), torch.arange(4))
    second = s.next(4)  # the cycle's third cluster, then its first again (its least-sampled prompts: none left)
    third = ({0, 1, 2} - {a, b}).pop()
    assert clusters_of(second).count(third) == 2 and len(set(clusters_of(second))) == 2
    assert clusters_of(sampler(start=1.0, mix=1).next(2)) in ([0, 0], [1, 1], [2, 2])


def test_the_curriculum_opens_easy_to_hard_and_the_filter_holds():
    s = sampler(start=0.5, ramp_draws=2, mix=3)
    assert set(s.next(3)) == {0, 1, 2}  # draw 1: the easiest half
    assert s.open_prompts().tolist() == [True] * 3 + [False] * 3
    s.next(1)
    assert s.open_prompts().sum() == 4  # draw 2: 0.75 of six
    s.next(1)
    assert bool(s.open_prompts().all())  # ramped
    f = sampler(start=1.0, mix=3)
    f.plan.keep[3] = False
    assert 3 not in f.next(5) and sorted(f.next(6)) == [0, 1, 2, 3, 4, 5]  # beyond the kept only when asked


def test_state_round_trip_missing_features_and_the_trait():
    s = SaerlSampler(60, seed=1, sae_steps=50, clusters=4)
    s.set_features(sparse_features())
    s.next(8)
    t = SaerlSampler(60, seed=1, sae_steps=50, clusters=4)
    t.load_state_dict(s.state_dict())
    assert torch.equal(t.plan.cluster, s.plan.cluster) and t.next(8) == s.next(8)
    with pytest.raises(ConfigError, match="was given no prompt features"):
        SaerlSampler(4).next(1)
    with pytest.raises(ConfigError, match="3 feature vectors for 4 prompts"):
        SaerlSampler(4).set_features(torch.zeros(3, 2))
    assert SAMPLERS.get("saerl").traits.features == "hidden_mean"
