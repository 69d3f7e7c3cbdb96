"""AdamW for low-precision training: moments stored in bf16 or 8 bits (or fp32), and bf16
weights updated with stochastic rounding, so that the learner can hold weights and gradients
in 2 bytes each and both moments in 4 or 2 (8 or 6 bytes a parameter instead of 16) and still
learn at small learning rates.

Rounding a bf16 weight to nearest after each step loses every update smaller than half its
spacing (2^-8 relative), which at RL learning rates (1e-6..1e-4) is most of them. Stochastic
rounding rounds up with probability equal to the remainder's share of the spacing, so the
update is kept in expectation (Zamirai et al. 2020, "Revisiting BFloat16 Training"). The
arithmetic is fp32, chunk by chunk, so no parameter-sized fp32 temporary is ever allocated.

8-bit moments are block-wise (256 values share an fp32 absmax) and logarithmic (codes spaced
evenly in log |x| below the block's absmax; 0 stays exact), in the spirit of block-wise
dynamic quantization (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"):
the first moment as sign + 127 levels over 7 decades (<= 6.6% relative error), the second as
its square root on 255 levels over 14 decades (<= 6.5%).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

_LOW_BITS = 1 << 16  # the fp32 mantissa bits a bf16 drops
_HIGH_MASK = -_LOW_BITS  # 0xFFFF0000 as int32
QBLOCK = 256  # values sharing one absmax in 8-bit moments
# the smallest non-zero code, as a fraction of the block's absmax: 1e-7 for the first moment; 1e-14 for
# the second moment's square root, so that it is never flushed to 0 while the first moment is not (an
# Adam step m / (sqrt(v) + eps) with v read as 0 would be m / eps, far larger than any real step)
_DECADES = {True: math.log(1e7), False: math.log(1e14)}


def quantize_log8(x: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (fp32, flat; length a multiple of QBLOCK) -> (int8/uint8 codes, fp32 absmax per block)."""
    levels = 127 if signed else 255
    blocks = x.view(-1, QBLOCK)
    scale = blocks.abs().amax(1)
    ratio = blocks.abs() / scale.clamp(min=1e-30).unsqueeze(1)
    codes = ratio.log_().mul_((levels - 1) / _DECADES[signed]).add_(levels).round_().clamp_(0, levels)
    if signed:
        return codes.mul_(blocks.sign()).to(torch.int8).view(-1), scale
    return codes.to(torch.uint8).view(-1), scale


def dequantize_log8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The inverse of `quantize_log8` (to within its rounding), fp32 and flat."""
    signed = codes.dtype == torch.int8
    levels = 127 if signed else 255
    q = codes.view(-1, QBLOCK).float()
    mag = q.abs()
    x = mag.sub(levels).mul_(_DECADES[signed] / (levels - 1)).exp_().mul_(mag > 0).mul_(scale.unsqueeze(1))
    return (x.mul_(q.sign()) if signed else x).view(-1)


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
        # drawn on the CPU whatever the parameters' device, so a run resumed on another device
        # continues with the same noise; copied once per step to each device that asks for it
        self.gen = torch.Generator().manual_seed(hash((seed, step)) & (2**62 - 1))
        self.chunk = chunk
        self.buf = torch.randint(0, _LOW_BITS, (2 * chunk,), dtype=torch.int32, generator=self.gen)
        self.on_device: dict[torch.device, torch.Tensor] = {self.buf.device: self.buf}

    def take(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """`n` noise values on `device`, from a random offset of this step's buffer."""
        device = torch.device(device)
        if device not in self.on_device:
            self.on_device[device] = self.buf.to(device)
        offset = int(torch.randint(0, self.chunk + 1, (1,), generator=self.gen))
        return self.on_device[device][offset:offset + n]


class AdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam (same update as torch.optim.AdamW) with moments in
    `state_dtype` and stochastic rounding for weights below fp32. The rounding noise is
    seeded by (seed, step), so a resumed run continues bit for bit."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, state_dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0, chunk: int = 1 << 18):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        if state_dtype == torch.int8 and chunk % QBLOCK:
            raise ValueError(f"chunk must be a multiple of {QBLOCK} with 8-bit moments (got {chunk})")
        self.state_dtype = state_dtype
        self.seed = seed
        self.chunk = chunk

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loading, then each state tensor back in its saved dtype: torch casts floating
        state to the parameter's dtype, which would turn bf16 moments of fp32 weights into fp32
        ones and round the fp32 scales of 8-bit moments of bf16 weights to bf16."""
        super().load_state_dict(state_dict)
        for group, saved_group in zip(self.param_groups, state_dict["param_groups"]):
            for p, index in zip(group["params"], saved_group["params"]):
                for key, value in state_dict["state"].get(index, {}).items():
                    if key != "step" and isinstance(value, torch.Tensor):
                        self.state[p][key] = value.to(device=p.device)

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
                    state.update(_new_moments(p, self.state_dtype))
                state["step"] += 1
                t = int(state["step"])
                if p.dtype != torch.float32 and noise is None:
                    noise = RoundingNoise(self.chunk, self.seed, t)
                local = {k: _local(v) for k, v in state.items()}  # FSDP2: this rank's shard of each
                _update(_local(p), _local(p.grad), local, lr=lr, b1=b1, b2=b2, eps=eps, wd=wd, bc1=1 - b1 ** t,
                        bc2=1 - b2 ** t, chunk=self.chunk, noise=noise)
        return loss


def _local(t: Any) -> Any:
    """A DTensor's local shard (sharing its storage: FSDP2 parameters update shard by shard), else `t`."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _new_moments(p: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Zero moments for `p`: plain tensors, or (dtype int8) 8-bit codes padded to whole blocks
    plus one fp32 absmax per block (the second moment stored as its square root)."""
    if dtype != torch.int8:
        return {"exp_avg": torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format),
                "exp_avg_sq": torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)}
    blocks = -(-p.numel() // QBLOCK)
    dev = p.device
    return {"exp_avg": torch.zeros(blocks * QBLOCK, dtype=torch.int8, device=dev),
            "exp_avg_scale": torch.zeros(blocks, device=dev),
            "exp_avg_sq": torch.zeros(blocks * QBLOCK, dtype=torch.uint8, device=dev),
            "exp_avg_sq_scale": torch.zeros(blocks, device=dev)}


def _update(p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], *, lr: float, b1: float, b2: float,
            eps: float, wd: float, bc1: float, bc2: float, chunk: int, noise: RoundingNoise | None) -> None:
    """One parameter's AdamW step, in fp32, `chunk` elements at a time (cache-sized temporaries)."""
    flat_p, flat_g = p.view(-1), grad.reshape(-1)
    flat_m, flat_v = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
    quantized = "exp_avg_scale" in state
    in_place = p.dtype == torch.float32
    n = flat_p.numel()
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        g = flat_g[s:e].float()
        if quantized:  # whole blocks: the chunk is a multiple of QBLOCK, the last one padded
            b0, b1_ = s // QBLOCK, -(-e // QBLOCK)
            qe = b1_ * QBLOCK
            m = dequantize_log8(flat_m[s:qe], state["exp_avg_scale"][b0:b1_])
            v = dequantize_log8(flat_v[s:qe], state["exp_avg_sq_scale"][b0:b1_]).square_()
            g = torch.nn.functional.pad(g, (0, qe - e))
        else:
            m, v = flat_m[s:e].float(), flat_v[s:e].float()
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        if quantized:
            flat_m[s:qe], state["exp_avg_scale"][b0:b1_] = quantize_log8(m, signed=True)
            flat_v[s:qe], state["exp_avg_sq_scale"][b0:b1_] = quantize_log8(v.sqrt(), signed=False)
            m, v = m[:e - s], v[:e - s]
        elif flat_m.dtype != torch.float32:  # (fp32 moments were updated in place above)
            flat_m[s:e].copy_(m)
            flat_v[s:e].copy_(v)
        denom = v.div(bc2).sqrt_().add_(eps)
        w = flat_p[s:e] if in_place else flat_p[s:e].float()
        if wd:
            w.mul_(1 - lr * wd)
        w.addcdiv_(m, denom, value=-lr / bc1)
        if not in_place:
            assert noise is not None
            stochastic_round_(flat_p[s:e], w, noise.take(w.numel(), w.device))
