"""AdamW for low-precision training: moments stored in bf16 (or fp32), and bf16 weights updated
with stochastic rounding, so that the learner can hold weights, gradients and both moments in
2 bytes each (8 bytes a parameter instead of 16) and still learn at small learning rates.

Rounding a bf16 weight to nearest after each step loses every update smaller than half its
spacing (2^-8 relative), which at RL learning rates (1e-6..1e-4) is most of them. Stochastic
rounding rounds up with probability equal to the remainder's share of the spacing, so the
update is kept in expectation (Zamirai et al. 2020, "Revisiting BFloat16 Training"). The
arithmetic is fp32, chunk by chunk, so no parameter-sized fp32 temporary is ever allocated.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

_LOW_BITS = 1 << 16  # the fp32 mantissa bits a bf16 drops
_HIGH_MASK = -_LOW_BITS  # 0xFFFF0000 as int32


def stochastic_round_(dst: torch.Tensor, src: torch.Tensor, noise: torch.Tensor) -> None:
    """dst (bf16) <- src (fp32, contiguous; clobbered) rounded up or down at random, with
    P(away from zero) = the dropped bits' share of one bf16 spacing: unbiased in expectation.
    `noise`: int32 uniform in [0, 2^16), src's shape."""
    bits = src.view(torch.int32)  # sign-magnitude: adding to the low bits grows |x| for either sign
    bits.add_(noise).bitwise_and_(_HIGH_MASK)
    dst.copy_(src)  # exact: the low 16 bits are now zero


class RoundingNoise:
    """Uniform 16-bit noise for stochastic rounding, cheaply: one random buffer of 2 x chunk
    values drawn per optimiser step, read at a random offset for each chunk. Every element
    gets a uniform draw each step (unbiased rounding); elements that share a draw within a
    step are only correlated, which does not bias the update."""

    def __init__(self, chunk: int, seed: int, step: int):
        self.gen = torch.Generator().manual_seed(hash((seed, step)) & (2**62 - 1))
        self.chunk = chunk
        self.buf = torch.randint(0, _LOW_BITS, (2 * chunk,), dtype=torch.int32, generator=self.gen)

    def take(self, n: int) -> torch.Tensor:
        offset = int(torch.randint(0, self.chunk + 1, (1,), generator=self.gen))
        return self.buf[offset:offset + n]


class AdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam (same update as torch.optim.AdamW) with moments in
    `state_dtype` and stochastic rounding for weights below fp32. The rounding noise is
    seeded by (seed, step), so a resumed run continues bit for bit."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, state_dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0, chunk: int = 1 << 18):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.state_dtype = state_dtype
        self.seed = seed
        self.chunk = chunk

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        noise: RoundingNoise | None = None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.state_dtype, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.state_dtype,
                                                           memory_format=torch.contiguous_format)
                state["step"] += 1
                t = int(state["step"])
                if p.dtype != torch.float32 and noise is None:
                    noise = RoundingNoise(self.chunk, self.seed, t)
                _update(p, p.grad, state["exp_avg"], state["exp_avg_sq"], lr=lr, b1=b1, b2=b2, eps=eps, wd=wd,
                        bc1=1 - b1 ** t, bc2=1 - b2 ** t, chunk=self.chunk, noise=noise)
        return loss


def _update(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *, lr: float,
            b1: float, b2: float, eps: float, wd: float, bc1: float, bc2: float, chunk: int,
            noise: RoundingNoise | None) -> None:
    """One parameter's AdamW step, in fp32, `chunk` elements at a time (cache-sized temporaries)."""
    flat_p, flat_g = p.view(-1), grad.reshape(-1)
    flat_m, flat_v = exp_avg.view(-1), exp_avg_sq.view(-1)
    in_place = p.dtype == torch.float32
    for s in range(0, flat_p.numel(), chunk):
        e = s + chunk
        g = flat_g[s:e].float()
        m = flat_m[s:e].float().lerp_(g, 1 - b1)
        v = flat_v[s:e].float().mul_(b2).addcmul_(g, g, value=1 - b2)
        if flat_m.dtype != torch.float32:  # (fp32 moments were updated in place above)
            flat_m[s:e].copy_(m)
            flat_v[s:e].copy_(v)
        denom = v.div(bc2).sqrt_().add_(eps)
        w = flat_p[s:e] if in_place else flat_p[s:e].float()
        if wd:
            w.mul_(1 - lr * wd)
        w.addcdiv_(m, denom, value=-lr / bc1)
        if not in_place:
            assert noise is not None
            stochastic_round_(flat_p[s:e], w, noise.take(w.numel()))
