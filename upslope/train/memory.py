"""Learner memory savers that change no result: an RMSNorm that keeps only its input for
backward, and handing freed heap pages back to the OS between steps."""
from __future__ import annotations

import ctypes
import ctypes.util
import types
from typing import Any

import torch

# RMSNorm classes computing exactly weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)
LLAMA_STYLE_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "Phi3RMSNorm"}


class _RMSNorm(torch.autograd.Function):
    """Llama-style RMSNorm. Autograd on the module's forward keeps about six activations per
    row (fp32 copies among them); this keeps the input and one fp32 scale per row and
    recomputes the normalised row in backward (a few elementwise ops, no matmul)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        n = x.float() * rstd
        dweight = None
        if ctx.needs_input_grad[1]:
            dweight = (dy * n.to(x.dtype)).float().reshape(-1, n.shape[-1]).sum(0).to(weight.dtype)
        dn = (dy * weight).float()
        dx = rstd * (dn - n * (dn * n).mean(-1, keepdim=True))
        return dx.to(x.dtype), dweight, None


def _lean_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def use_lean_norms(model: torch.nn.Module) -> int:
    """Swap the forward of every Llama-style RMSNorm in `model` for the lean one; returns how
    many were swapped (0 for architectures whose norm differs, which keep theirs)."""
    count = 0
    for module in model.modules():
        if type(module).__name__ in LLAMA_STYLE_NORMS and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_lean_forward, module)
            count += 1
    return count


_LIBC: Any = None


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS (glibc `malloc_trim`; a no-op elsewhere). A step's
    activations are freed into the heap, which otherwise keeps them as resident memory."""
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
            if _LIBC and not hasattr(_LIBC, "malloc_trim"):
                _LIBC = False
        except OSError:
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)
