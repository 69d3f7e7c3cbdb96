"""Seeded weight noise (upslope/train/methods/perturb.py): regenerated bit for bit from its seeds,
perturbed copies that leave the policy alone, and an in-place update equal to the copy."""
from __future__ import annotations

import pytest
import torch

from upslope.train.methods.perturb import WeightNoise, noise_seed


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2, bias=False))


def test_directions_are_regenerated_exactly_and_differ_by_every_index():
    noise = WeightNoise(small_model(), seed=5)
    a = noise.direction(step=3, j=1, i=0)
    assert torch.equal(a, WeightNoise(small_model(), seed=5).direction(3, 1, 0)) and a.shape == (4, 3)
    for other in [(4, 1, 0), (3, 2, 0)]:
        assert not torch.equal(a, noise.direction(*other))
    assert not torch.equal(a, WeightNoise(small_model(), seed=6).direction(3, 1, 0))
    seeds = {noise_seed(s, t, j, i) for s in range(3) for t in range(3) for j in range(3) for i in range(3)}
    assert len(seeds) == 81 and all(0 <= x < 2**63 for x in seeds)


def test_moved_copy_is_the_hand_sum_and_leaves_the_model_alone():
    model = small_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    noise = WeightNoise(model, seed=1)
    coefs = {0: 0.5, 2: -0.25}
    moved = dict(noise.moved(7, coefs))
    for i, (name, p) in enumerate(model.named_parameters()):
        assert torch.equal(p, before[name])  # untouched (a float32 copy must not alias the parameter)
        want = before[name] + 0.5 * noise.direction(7, 0, i) - 0.25 * noise.direction(7, 2, i)
        assert torch.allclose(moved[name], want, atol=1e-7)


def test_apply_moves_the_policy_to_the_moved_copy_and_reports_its_rms():
    model = small_model()
    noise = WeightNoise(model, seed=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    coefs = {1: 0.1, 3: 0.2}
    moved = dict(noise.moved(2, coefs))
    rms = noise.apply_(2, coefs)
    deltas = []
    for name, p in model.named_parameters():
        assert torch.equal(p, moved[name])  # bitwise: the engine and the policy see the same weights
        deltas.append((p.detach() - before[name]).flatten())
    assert rms == pytest.approx(float(torch.cat(deltas).pow(2).mean().sqrt()), rel=1e-6)
    assert noise.apply_(2, {0: 0.0}) == 0.0 and all(torch.equal(p, moved[n]) for n, p in model.named_parameters())


def test_bfloat16_weights_are_perturbed_in_float32_then_rounded():
    model = small_model().to(torch.bfloat16)
    noise = WeightNoise(model, seed=0)
    moved = dict(noise.moved(1, {0: 1e-2}))
    for i, (name, p) in enumerate(model.named_parameters()):
        assert moved[name].dtype == torch.bfloat16
        assert torch.equal(moved[name], (p.float() + 1e-2 * noise.direction(1, 0, i)).to(torch.bfloat16))
