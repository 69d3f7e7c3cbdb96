"""Evaluation statistics: the unbiased pass@k estimator, maj@k and mean@k."""
from __future__ import annotations

from collections import Counter
from math import comb
from typing import Hashable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):  # product form of C(n-c,k)/C(n,k), stable for large n
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def pass_at_k_combinatorial(n: int, c: int, k: int) -> float:
    """The same estimator by its definition (for tests)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """1 if the most common answer among the first k samples is a correct one (ties go to
    the answer seen first); samples without an extractable answer do not vote."""
    votes = [(a, ok) for a, ok in zip(answers[:k], correct[:k]) if a is not None]
    if not votes:
        return 0.0
    counts = Counter(a for a, _ in votes)
    best = max(counts.values())
    winner = next(a for a, _ in votes if counts[a] == best)
    return float(any(ok for a, ok in votes if a == winner))
