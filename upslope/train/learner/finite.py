"""Guards against non-finite numbers: an optimiser step whose gradient norm is NaN or inf is
skipped (its gradients dropped, the weights and optimiser state untouched) and counted, and a
run whose steps keep being skipped stops with one line instead of training on garbage."""
from __future__ import annotations

import math
from typing import Any

import torch

from upslope.errors import UpslopeError


class NonFiniteGuard:
    """Counts optimiser steps skipped for a non-finite gradient norm; after `limit` in a row the
    run cannot recover and `skip` raises (one line)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.consecutive = 0
        self.skipped = 0  # since the last `take`

    def skip(self, grad_norm: torch.Tensor | float, optimizer: Any) -> bool:
        """True (and the gradients dropped) when this step must be skipped."""
        if math.isfinite(float(grad_norm)):
            self.consecutive = 0
            return False
        optimizer.zero_grad(set_to_none=True)
        self.consecutive += 1
        self.skipped += 1
        if self.consecutive >= self.limit:
            raise UpslopeError(f"the gradient norm was {float(grad_norm)} in {self.consecutive} optimiser steps in a "
                               f"row (optim.max_nonfinite_steps={self.limit}); the run cannot recover: lower "
                               f"optim.lr, check the loss and rewards, or resume from an earlier checkpoint")
        return True

    def take(self) -> float:
        """Steps skipped since the last call (the metric learner/nonfinite_skipped)."""
        n, self.skipped = self.skipped, 0
        return float(n)

