"""Evaluation statistics: the unbiased pass@k estimator and maj@k."""
from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.eval.metrics import maj_at_k, pass_at_k, pass_at_k_combinatorial

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@st.composite
def n_c_k(draw, max_n: int = 60):
    n = draw(st.integers(1, max_n))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@settings(max_examples=300, deadline=None)
@given(n_c_k())
def test_pass_at_k_equals_combinatorial_definition(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_combinatorial(n, c, k), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(n_c_k(max_n=12))
def test_pass_at_k_is_probability_that_a_random_k_subset_has_a_correct_sample(nck):
    """Enumerate every k-subset of n samples (c correct): the estimator is exact."""
    n, c, k = nck
    subsets = list(itertools.combinations(range(n), k))
    hit = sum(any(i < c for i in s) for s in subsets)
    assert pass_at_k(n, c, k) == pytest.approx(float(Fraction(hit, len(subsets))), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(n_c_k())
def test_pass_at_k_bounds_and_monotonicity(nck):
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the fraction correct
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12
    assert (p == 0.0) == (c == 0)


@pytest.mark.parametrize("n, c, k, expected", [
    (2, 1, 1, 0.5),
    (2, 1, 2, 1.0),
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 5, 1 - 21 / 252),  # C(7,5)=21, C(10,5)=252
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),
    (100, 1, 1, 0.01),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # C(1000, 500) overflows a float; the product form does not
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    assert pass_at_k(1000, 2, 500) == pytest.approx(1 - (500 * 499) / (1000 * 999))


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        pass_at_k(4, 1, 5)


@pytest.mark.parametrize("answers, correct, k, expected", [
    (["3", "3", "4"], [True, True, False], 3, 1.0),  # clear majority, correct
    (["4", "3", "4"], [False, True, False], 3, 0.0),  # majority wrong, one right
    (["4", "3", "4", "3"], [False, True, False, True], 4, 0.0),  # tie 2-2: first seen ('4') wins
    (["3", "4", "4", "3"], [True, False, False, True], 4, 1.0),  # tie 2-2: first seen ('3') wins
    (["4", "4", "3", "3", "3"], [False, False, True, True, True], 4, 0.0),  # only the first k vote
    (["4", "4", "3", "3", "3"], [False, False, True, True, True], 5, 1.0),
    ([None, None, "3"], [False, False, True], 3, 1.0),  # no-answer samples do not vote
    ([None, "4", None, "3", "3"], [False, False, False, True, True], 5, 1.0),
    ([None, None], [False, False], 2, 0.0),  # nobody votes
    (["7"], [True], 1, 1.0),
    ([], [], 3, 0.0),
])
def test_maj_at_k_hand_values(answers, correct, k, expected):
    assert maj_at_k(answers, correct, k) == expected


def test_maj_at_k_winner_correct_if_any_of_its_votes_is():
    # equivalent answers judged by the reward ('18' correct), keyed the same
    assert maj_at_k(["18", "18", "5"], [False, True, False], 3) == 1.0


def test_step_line_shows_only_the_metrics_a_method_logs():
    from upslope.logs.progress import step_line

    sft = step_line(3, {"loss": 1.25, "entropy": 0.5, "time/step": 2.0, "time/learner": 1.9})
    assert sft == "step 3: loss +1.2500 ent 0.500 | 2.0s (learn 1.9)"
    rl = step_line(1, {"reward/mean": 0.5, "accuracy": 0.25, "kl": 0.01, "time/step": 6.7, "time/rollout": 2.3})
    assert rl == "step 1: reward 0.500 acc 0.250 kl 0.0100 | 6.7s (roll 2.3)"
