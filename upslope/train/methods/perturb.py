"""Gaussian weight noise for gradient-free search (`upslope randopt`), regenerated from seeds:
direction j of step s is, for parameter i, randn(shape) from a generator seeded by (seed, s, j, i),
so no direction is ever stored. A perturbed or moved copy of the weights is produced one tensor at a
time (for `engine.update_weights`), and an update is applied to the policy in place."""
from __future__ import annotations

import hashlib
from typing import Any, Iterator, Mapping

import torch


def noise_seed(seed: int, step: int, direction: int, param: int) -> int:
    """A 63-bit generator seed of (run seed, step, direction, parameter index), independent across all four."""
    digest = hashlib.blake2b(f"{seed}:{step}:{direction}:{param}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class WeightNoise:
    """Seeded unit Gaussian directions over a model's parameters (in `named_parameters` order; tied
    weights once). The noise is drawn in float32 on each parameter's device: the same on every run
    on that kind of device, so a resumed run regenerates it exactly."""

    def __init__(self, model: Any, seed: int):
        self.params = list(model.named_parameters())
        self.seed = seed

    def direction(self, step: int, j: int, i: int) -> torch.Tensor:
        """Parameter i's part of direction j of `step` (float32, unit variance)."""
        p = self.params[i][1]
        g = torch.Generator(device=p.device)
        g.manual_seed(noise_seed(self.seed, step, j, i))
        return torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)

    def moved(self, step: int, coefs: Mapping[int, float]) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, weights + sum_j coefs[j] x direction j) for every parameter, one at a time, in the
        parameter's dtype; the policy itself is not changed."""
        with torch.no_grad():
            for i, (name, p) in enumerate(self.params):
                yield name, self._moved(step, coefs, i, p)

    def _moved(self, step: int, coefs: Mapping[int, float], i: int, p: torch.Tensor) -> torch.Tensor:
        out = p.detach().to(torch.float32, copy=True)  # .float() of a float32 tensor would alias it
        for j, c in coefs.items():
            if c != 0:
                out = out.add_(self.direction(step, j, i), alpha=float(c))
        return out.to(p.dtype)

    def apply_(self, step: int, coefs: Mapping[int, float]) -> float:
        """Move the policy's weights in place by sum_j coefs[j] x direction j (the same values `moved`
        yields); returns the root mean square of the change actually applied, per weight."""
        if not any(coefs.values()):
            return 0.0
        squares, count = 0.0, 0
        with torch.no_grad():
            for i, (_, p) in enumerate(self.params):
                new = self._moved(step, coefs, i, p)
                squares += float(torch.linalg.vector_norm(new.float() - p.float())) ** 2
                count += p.numel()
                p.copy_(new)
        return (squares / max(count, 1)) ** 0.5
