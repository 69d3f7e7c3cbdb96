"""Split the micro-batches of a mini-batch across ranks, balanced by token count."""
from __future__ import annotations


def assign_by_tokens(tokens: list[int], world: int) -> list[list[int]]:
    """For each rank, the micro-batch positions it runs: largest first to the least loaded rank
    (ties to the lower rank), each rank's positions in their original order. Deterministic, so
    every rank computes the same split without communicating."""
    loads, shares = [0] * world, [[] for _ in range(world)]
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        loads[r] += tokens[i]
        shares[r].append(i)
    return [sorted(s) for s in shares]
