"""Learner memory savers that change no result: an RMSNorm and a SwiGLU MLP that keep fewer
activations for backward (recomputing cheap elementwise ops instead), and handing freed heap
pages back to the OS between steps."""
from __future__ import annotations

import ctypes
import ctypes.util
import types
from typing import Any

import torch

from upslope.train.learner.amp import replay_autocast, save_autocast

# RMSNorm classes computing exactly weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)
LLAMA_STYLE_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}
# MLP classes computing exactly down_proj(act_fn(gate_proj(x)) * up_proj(x))
LLAMA_STYLE_MLPS = {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}


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


class _SwiGLUDown(torch.autograd.Function):
    """down(silu(gate) * up). Autograd on the module keeps gate, silu(gate), up and their
    product (the down projection's input); this keeps gate and up and recomputes the other
    two in backward: half the MLP's saved activations, no extra matmul."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        save_autocast(ctx, gate)
        ctx.save_for_backward(gate, up, weight, bias)
        return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with replay_autocast(ctx):
            return _SwiGLUDown._backward(ctx, d_out)

    @staticmethod
    def _backward(ctx: Any, d_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up, weight, bias = ctx.saved_tensors
        dtype = ctx.amp_dtype or weight.dtype
        act = torch.nn.functional.silu(gate)
        d_out = d_out.to(dtype)
        dw = db = None
        if ctx.needs_input_grad[2]:
            product = (act * up).to(dtype)
            dw = (d_out.reshape(-1, d_out.shape[-1]).t() @ product.reshape(-1, product.shape[-1])).to(weight.dtype)
        if bias is not None and ctx.needs_input_grad[3]:
            db = d_out.reshape(-1, d_out.shape[-1]).float().sum(0).to(bias.dtype)
        d_product = (d_out @ weight.to(dtype)).to(gate.dtype)
        sig = torch.sigmoid(gate)
        d_gate = d_product * up * (sig * (1 + gate * (1 - sig)))
        d_up = d_product * act
        return d_gate, d_up, dw, db


def _lean_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _lean_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    down = self.down_proj
    if type(down) is not torch.nn.Linear:  # e.g. a LoRA layer wrapped around it later: the module's own path
        return type(self).forward(self, x)
    return _SwiGLUDown.apply(self.gate_proj(x), self.up_proj(x), down.weight, down.bias)


def use_lean_activations(model: torch.nn.Module) -> int:
    """Swap the forward of every Llama-style RMSNorm and SiLU MLP in `model` for the lean ones;
    returns how many modules were swapped (architectures that differ keep their own)."""
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if name in LLAMA_STYLE_NORMS and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_lean_norm_forward, module)
            count += 1
        elif name in LLAMA_STYLE_MLPS and getattr(getattr(module, "config", None), "hidden_act", None) == "silu":
            module.forward = types.MethodType(_lean_mlp_forward, module)
            count += 1
    return count


_LIBC: Any = None


def _libc() -> Any:
    """glibc through ctypes (False where there is none: then the memory helpers are no-ops)."""
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
            if _LIBC and not hasattr(_LIBC, "malloc_trim"):
                _LIBC = False
        except OSError:
            _LIBC = False
    return _LIBC


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def return_large_frees(threshold: int = 1 << 20) -> bool:
    """Serve every allocation of >= `threshold` bytes (1 MiB) by its own mmap, so that freeing it
    hands the memory back to the OS at once (glibc's M_MMAP_THRESHOLD, fixed: glibc otherwise
    raises it to 32 MiB after such frees). A sharded CPU learner allocates many transient 1-32 MiB
    buffers (FSDP's per-layer gathers, gloo's, activations) that would otherwise stay resident as
    freed heap and set its peak RSS (measured: 3.5 -> 1.8 GiB per rank, docs/distributed.md).
    Skipped when the user set MALLOC_MMAP_THRESHOLD_ or there is no glibc; True when applied."""
    import os

    libc = _libc()
    if not libc or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))


def release_freed_memory(device: torch.device | str = "cpu") -> None:
    """Return the heap's free pages to the OS (glibc `malloc_trim`; a no-op elsewhere). A step's
    activations are freed into the heap, which otherwise keeps them as resident memory. Only
    for a learner on the CPU: on a GPU the activations never touch the host heap, and the
    trim would cost time for nothing."""
    if torch.device(device).type != "cpu":
        return
    libc = _libc()
    if libc:
        libc.malloc_trim(0)
