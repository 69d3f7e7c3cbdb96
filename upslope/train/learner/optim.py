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
