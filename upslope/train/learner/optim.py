"""Optimiser and learning-rate schedule."""
from __future__ import annotations

import math
from typing import Iterable

import torch

from upslope.config import OptimConfig
from upslope.train.learner.adamw import AdamW


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig, seed: int = 0) -> torch.optim.Optimizer:
    """AdamW. fp32 weights with fp32 moments: torch's fused kernel (one pass per tensor, no
    parameter-sized temporaries; the multi-tensor `foreach` path allocates several). Otherwise
    upslope's AdamW: fp32 arithmetic in cache-sized chunks, stochastic rounding for bf16 weights
    (whose small updates rounding to nearest would drop), and by default (`auto`) 8-bit moments
    when the weights are bf16 (6 bytes a parameter in all, with the bf16 gradient)."""
    trainable = [p for p in params if p.requires_grad]
    low = any(p.dtype != torch.float32 for p in trainable)
    state = cfg.state_dtype if cfg.state_dtype != "auto" else ("int8" if low else "float32")
    kw = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if state == "float32" and not low:
        return torch.optim.AdamW(trainable, fused=True, **kw)
    return AdamW(trainable, state_dtype=getattr(torch, state), seed=seed, **kw)


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak lr after `step` optimiser steps: linear warmup, then
    constant, cosine or linear decay to min_lr_ratio at `total`."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(total - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    if cfg.schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        decay = 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


def make_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total_steps, cfg))


def moments_as(saved: dict, optimizer: torch.optim.Optimizer) -> dict:
    """`saved` (an optimiser state dict) with each parameter's moments in the layout `optimizer` keeps:
    8-bit blocks, bf16 or fp32 tensors. A checkpoint written where the defaults chose another layout
    (a CPU run's bf16 weights with 8-bit moments, resumed on a GPU with fp32 master weights and
    torch's fused AdamW, or the reverse) resumes with the same moments, converted once: exact where
    the target holds more precision than the source, within the 8-bit rounding where it holds less.
    A state already in the target's layout is returned as it is (bit-exact resume)."""
    from upslope.train.learner.adamw import QBLOCK, dequantize_log8, quantize_log8

    ours = isinstance(optimizer, AdamW)
    params = {i: p for group, saved_group in zip(optimizer.param_groups, saved["param_groups"])
              for p, i in zip(group["params"], saved_group["params"])}
    state = {}
    for index, st in saved["state"].items():
        p = params.get(index)
        if p is None or "exp_avg" not in st:
            state[index] = st
            continue
        quantized = "exp_avg_scale" in st
        want_quantized = ours and optimizer.state_dtype == torch.int8
        want_dtype = optimizer.state_dtype if ours and not want_quantized else p.dtype if not ours else None
        if quantized == want_quantized and (quantized or st["exp_avg"].dtype == want_dtype):
            state[index] = st
            continue
        n = p.numel()
        if quantized:
            m = dequantize_log8(st["exp_avg"], st["exp_avg_scale"])[:n]
            v = dequantize_log8(st["exp_avg_sq"], st["exp_avg_sq_scale"])[:n].square()
        else:
            m, v = st["exp_avg"].float().reshape(-1), st["exp_avg_sq"].float().reshape(-1)
        moved = {"step": st["step"]}
        if want_quantized:
            pad = -(-n // QBLOCK) * QBLOCK - n
            moved["exp_avg"], moved["exp_avg_scale"] = quantize_log8(torch.nn.functional.pad(m, (0, pad)), signed=True)
            moved["exp_avg_sq"], moved["exp_avg_sq_scale"] = quantize_log8(
                torch.nn.functional.pad(v.sqrt(), (0, pad)), signed=False)
        else:
            moved["exp_avg"] = m.to(want_dtype).view(p.shape)
            moved["exp_avg_sq"] = v.to(want_dtype).view(p.shape)
        state[index] = moved
    return {**saved, "state": state}
