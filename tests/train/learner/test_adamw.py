"""upslope's AdamW: torch's update in fp32, bf16 moments, and stochastic rounding of bf16 weights."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.config import OptimConfig
from upslope.train.learner.adamw import AdamW, stochastic_round_
from upslope.train.learner.optim import make_optimizer


def run_steps(opt: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(p.dtype)
        opt.step()


def random_problem(seed: int, shapes=((37, 11), (300,), (5,))) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) * 10 ** float(torch.empty(1).uniform_(-4, 1, generator=gen))
              for s in shapes] for _ in range(5)]
    return params, grads


@pytest.mark.parametrize("chunk", [7, 1 << 18])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_fp32_weights_and_moments_match_torch_adamw(chunk, wd):
    params, grads = random_problem(0)
    ref = [p.clone().requires_grad_() for p in params]
    ours = [p.clone().requires_grad_() for p in params]
    run_steps(torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd, foreach=False), ref, grads)
    run_steps(AdamW(ours, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd, state_dtype=torch.float32,
                    chunk=chunk), ours, grads)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_bf16_moments_stay_close_to_fp32_adamw():
    params, grads = random_problem(1)
    ref = [p.clone().requires_grad_() for p in params]
    ours = [p.clone().requires_grad_() for p in params]
    run_steps(torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0, foreach=False), ref, grads)
    opt = AdamW(ours, lr=1e-2, state_dtype=torch.bfloat16)
    run_steps(opt, ours, grads)
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in opt.state.values())
    for a, b, p in zip(ours, ref, params):
        rel = ((a - b).abs() / (b - p).abs()).detach()  # error relative to how far fp32 AdamW moved the weight
        assert float(rel.median()) < 0.005 and float((rel < 0.02).float().mean()) > 0.95


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=-1e4, max_value=1e4, allow_nan=False).filter(lambda x: abs(x) > 1e-30))
def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour(x):
    n = 20000
    src = torch.full((n,), x, dtype=torch.float32)
    dst = torch.empty(n, dtype=torch.bfloat16)
    noise = torch.randint(0, 1 << 16, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    stochastic_round_(dst, src.clone(), noise)
    x32 = torch.tensor(x, dtype=torch.float32)
    down = (x32.view(torch.int32) & -65536).view(torch.float32)  # toward zero
    up = ((x32.view(torch.int32) & -65536) + 65536).view(torch.float32)  # away from zero
    vals = dst.float()
    assert bool(((vals == down) | (vals == up)).all())
    if down == x32:
        assert bool((vals == x32).all())  # representable: unchanged
    else:
        p_up = float((x32 - down) / (up - down))
        assert float((vals == up).float().mean()) == pytest.approx(p_up, abs=0.015)


def test_small_updates_survive_in_bf16_only_with_stochastic_rounding():
    """lr 1e-4 on weights of 1.0 (bf16 spacing there: 2^-7): every step rounds to nearest back to
    1.0 with torch's AdamW, while stochastic rounding moves the weights by ~lr per step."""
    steps, lr = 100, 1e-4
    grads = [[torch.ones(4096)] for _ in range(steps)]
    nearest = [torch.ones(4096, dtype=torch.bfloat16, requires_grad=True)]
    run_steps(torch.optim.AdamW(nearest, lr=lr), nearest, grads)
    assert bool((nearest[0] == 1.0).all())
    sr = [torch.ones(4096, dtype=torch.bfloat16, requires_grad=True)]
    run_steps(AdamW(sr, lr=lr), sr, grads)
    assert float(sr[0].detach().float().mean()) == pytest.approx(1.0 - steps * lr, abs=1e-3)


@pytest.mark.parametrize("weights,state", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)])
def test_resume_from_state_dict_continues_bit_for_bit(weights, state):
    params, grads = random_problem(2)
    a = [p.to(weights).requires_grad_() for p in params]
    opt_a = AdamW(a, lr=1e-3, seed=7, state_dtype=state)
    run_steps(opt_a, a, grads[:2])
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = AdamW(b, lr=1e-3, seed=7, state_dtype=state)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert all(s["exp_avg"].dtype == state for s in opt_b.state.values())  # not cast to the weights' dtype
    run_steps(opt_a, a, grads[2:])
    run_steps(opt_b, b, grads[2:])
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("weights,state,expected", [
    (torch.float32, "auto", torch.optim.AdamW), (torch.bfloat16, "auto", AdamW), (torch.float32, "bfloat16", AdamW)])
def test_make_optimizer_picks_the_kernel(weights, state, expected):
    p = torch.nn.Parameter(torch.zeros(3, dtype=weights))
    opt = make_optimizer([p], OptimConfig(state_dtype=state))
    assert type(opt) is expected
    if weights == torch.bfloat16:  # 8-bit moments by default for bf16 weights
        assert opt.state_dtype == torch.int8


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([True, False]), st.floats(1e-12, 1e3))
def test_log8_round_trip_is_within_its_relative_error(seed, signed, magnitude):
    from upslope.train.learner.adamw import QBLOCK, dequantize_log8, quantize_log8

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4 * QBLOCK, generator=gen) * magnitude * torch.exp(torch.randn(4 * QBLOCK, generator=gen) * 3)
    if not signed:
        x = x.abs()
    x[::7] = 0.0
    codes, scale = quantize_log8(x, signed)
    assert codes.dtype == (torch.int8 if signed else torch.uint8) and scale.numel() == 4
    y = dequantize_log8(codes, scale)
    decades = 7 if signed else 14  # the codes' range below the block's absmax
    blockmax = x.view(-1, QBLOCK).abs().amax(1).repeat_interleave(QBLOCK)
    big = x.abs() >= 10.0 ** -decades * blockmax
    rel = ((y - x).abs() / x.abs())[big & (x != 0)]
    half_step = math.log(10.0 ** decades) / (126 if signed else 254) / 2  # codes are evenly spaced in log |x|
    assert float(rel.max()) <= math.exp(half_step) - 1 + 1e-4  # 6.6% signed, 6.5% unsigned
    assert bool((y[x == 0] == 0).all()) and bool((y.sign() == x.sign())[big].all())
    assert bool(((y - x).abs()[~big] <= 10.0 ** -decades * blockmax[~big]).all())  # below range: ~0


def test_int8_moments_track_fp32_adamw_and_take_a_quarter_of_the_memory():
    params, grads = random_problem(3, shapes=((300, 7), (1000,)))
    ref = [p.clone().requires_grad_() for p in params]
    ours = [p.clone().requires_grad_() for p in params]
    run_steps(torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0, foreach=False), ref, grads)
    opt = AdamW(ours, lr=1e-2, state_dtype=torch.int8, chunk=512)
    run_steps(opt, ours, grads)
    for a, b, p in zip(ours, ref, params):
        rel = ((a - b).abs() / (b - p).abs()).detach()
        assert float(rel.median()) < 0.03 and float((rel < 0.15).float().mean()) > 0.9
    state_bytes = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    fp32_bytes = sum(2 * p.numel() * 4 for p in params)
    assert state_bytes < 0.3 * fp32_bytes  # 2 bytes + an fp32 absmax per 256 values, tensors padded to 256


def test_int8_moments_resume_bit_for_bit():
    params, grads = random_problem(4)
    a = [p.to(torch.bfloat16).requires_grad_() for p in params]
    opt_a = AdamW(a, lr=1e-3, seed=3, state_dtype=torch.int8)
    run_steps(opt_a, a, grads[:2])
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = AdamW(b, lr=1e-3, seed=3, state_dtype=torch.int8)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    run_steps(opt_a, a, grads[2:])
    run_steps(opt_b, b, grads[2:])
    assert all(torch.equal(x, y) for x, y in zip(a, b))
