"""Autocast for custom autograd functions on whatever device their tensors are on.

`torch.amp.custom_fwd/custom_bwd` take the device type when the function is defined; a
function written for the CPU then runs its backward without the GPU's autocast (or the
reverse). These helpers record the forward's autocast state from the actual tensor and
replay it in backward."""
from __future__ import annotations

import contextlib
from typing import Any

import torch


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype active for `device_type` now, or None when autocast is off there
    (or the device has no autocast, e.g. `meta`)."""
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def save_autocast(ctx: Any, t: torch.Tensor) -> None:
    """Record on `ctx` the autocast state of `t`'s device during forward."""
    ctx.amp_device, ctx.amp_dtype = t.device.type, autocast_dtype(t.device.type)


def replay_autocast(ctx: Any) -> contextlib.AbstractContextManager:
    """The forward's autocast state again (for backward, which autograd runs outside it)."""
    if ctx.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(ctx.amp_device, dtype=ctx.amp_dtype)
