"""The run's randomness: every step (and every collect round of it) reseeds Python's, NumPy's and
torch's RNGs from (run seed, step), so a resumed run repeats the same randomness."""
from __future__ import annotations

import random

import numpy as np
import torch


def step_seed(seed: int, step: int) -> int:
    """The seed of (run seed, step), without seeding anything (prefetched rollouts use it ahead of time)."""
    return (seed * 1_000_003 + step * 7_919) % (2**31)


def seed_everything(seed: int) -> int:
    """Seed Python's, NumPy's and torch's RNGs with `seed`; returns it."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed


def seed_step(seed: int, step: int) -> int:
    """Seed every RNG from (seed, step), so a resumed run repeats the same randomness."""
    return seed_everything(step_seed(seed, step))
