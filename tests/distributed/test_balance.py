"""The split of a mini-batch's micro-batches across ranks: every micro-batch runs on exactly one
rank, the loads are balanced by tokens, and every rank computes the same split."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.distributed.balance import assign_by_tokens


def test_hand_computed_split():
    # largest first to the least loaded: 9 -> r0, 7 -> r1, 5 -> r1 (7 < 9), 2 -> r0 (9 < 12), 1 -> r0 (11 < 12)
    assert assign_by_tokens([5, 9, 1, 7, 2], 2) == [[1, 2, 4], [0, 3]]


def test_fewer_micro_batches_than_ranks_leaves_ranks_empty():
    assert assign_by_tokens([4], 3) == [[0], [], []]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=40), st.integers(1, 8))
def test_every_micro_batch_once_and_balanced(tokens, world):
    shares = assign_by_tokens(tokens, world)
    assert sorted(i for s in shares for i in s) == list(range(len(tokens)))
    assert all(s == sorted(s) for s in shares)
    loads = [sum(tokens[i] for i in s) for s in shares]
    if tokens:  # greedy largest-first: no rank exceeds the least loaded one by more than one micro-batch
        assert max(loads) - min(loads) <= max(tokens)
    assert assign_by_tokens(list(tokens), world) == shares
