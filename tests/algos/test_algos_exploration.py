"""The DARTS filter against hand-computed cases (issue 21, part 2)."""
from __future__ import annotations

import torch

from upslope.batch import build_batch
from upslope.registry import FILTERS


def _group(lengths, mean_lps, rewards):
    b = build_batch([[1]] * len(lengths), [[5] * n for n in lengths], [[lp] * n for n, lp in zip(lengths, mean_lps)],
                    [0] * len(lengths), [False] * len(lengths), 2)
    b.rewards = torch.tensor(rewards, dtype=torch.float32)
    return b


def test_darts_scores_and_balance_by_hand():
    """Lengths 2, 4, 4, 2 (max 4), mean log-probs -0.1, -0.1, -1.0, -2.0, length_coef 1: scores -0.6, -1.1,
    -2.0, -2.5. Rewards 1, 1, 0, 0, keep 2, balanced: the best right (row 0) and the best wrong (row 2)."""
    b = _group([2, 4, 4, 2], [-0.1, -0.1, -1.0, -2.0], [1.0, 1.0, 0.0, 0.0])
    from upslope.algos.exploration import darts_scores

    assert torch.allclose(darts_scores(b, length_coef=1.0), torch.tensor([-0.6, -1.1, -2.0, -2.5]))
    keep = FILTERS.bind("darts", {"keep": 2})(b)
    assert keep.tolist() == [True, False, True, False]
    unbalanced = FILTERS.bind("darts", {"keep": 2, "balance": False})(b)
    assert unbalanced.tolist() == [True, True, False, False]  # the top two by score: the group loses its variance
    confidence_only = FILTERS.bind("darts", {"keep": 1, "length_coef": 0.0, "balance": False})(b)
    assert confidence_only.tolist() == [True, False, False, False]  # tie (-0.1, -0.1): the earlier row


def test_darts_keeps_a_mixed_group_mixed():
    """One right of four, keep 2: round(0.5) = 0 right would empty the variance, so the right one is kept
    with the best wrong one (row 3, log-prob -0.1)."""
    b = _group([3, 3, 3, 3], [-3.0, -0.5, -0.2, -0.1], [1.0, 0.0, 0.0, 0.0])
    keep = FILTERS.bind("darts", {"keep": 2})(b)
    assert keep.tolist() == [True, False, False, True]
    assert int(keep.sum()) == 2
