"""Calibration and selective-prediction statistics by hand (ECE, Brier, AURC with ties, coverage and
selective risk), a property test of AURC against every ordering of its ties, and `evaluate` on the tiny
model reporting them from the completions it wrote."""
from __future__ import annotations

import itertools
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.eval.calibration import (aurc, brier_score, calibration_summary, expected_calibration_error,
                                      selective_summary)
from upslope.rewards.calibration import _ABSTAIN, _CONFIDENCE, stated_confidence

CONF, RIGHT = [0.9, 0.9, 0.2, 0.25, 1.0], [True, False, False, False, True]


def test_ece_and_brier_by_hand():
    # bin 9 holds 0.9, 0.9, 1.0 (the last bin includes 1): accuracy 2/3, confidence 2.8/3; bin 2 holds 0.2, 0.25
    want = (3 * abs(2 / 3 - 2.8 / 3) + 2 * abs(0 - 0.225)) / 5
    assert expected_calibration_error(CONF, RIGHT) == pytest.approx(want) == pytest.approx(0.25)
    assert brier_score(CONF, RIGHT) == pytest.approx((0.01 + 0.81 + 0.04 + 0.0625 + 0) / 5)
    assert expected_calibration_error([0.7] * 10, [True] * 7 + [False] * 3) == pytest.approx(0)  # calibrated
    assert expected_calibration_error([], []) == 0.0 and brier_score([], []) == 0.0


def test_aurc_by_hand():
    # ranked 3, 2, 1: risks 0/1, 1/2, 1/3
    assert aurc([3, 2, 1], [True, False, True]) == pytest.approx((0 + 1 / 2 + 1 / 3) / 3)
    # a tie is in random order: orders TF (risks 0, 1/2) and FT (1, 1/2) average to 1/2
    assert aurc([1, 1], [True, False]) == pytest.approx(0.5)
    assert aurc([1, 1], [False, True]) == pytest.approx(0.5)
    assert aurc([2, 1], [True, False]) == pytest.approx(0.25) and aurc([], []) == 0.0


def brute_aurc(scores: list[int], correct: list[bool]) -> float:
    """The mean AURC over every order of the samples consistent with the scores (ties in every order)."""
    values = []
    for perm in itertools.permutations(range(len(scores))):
        if any(scores[perm[i]] < scores[perm[i + 1]] for i in range(len(perm) - 1)):
            continue
        errs = 0
        total = 0.0
        for k, i in enumerate(perm, 1):
            errs += not correct[i]
            total += errs / k
        values.append(total / len(perm))
    return sum(values) / len(values)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=6))
def test_aurc_is_the_mean_over_tie_orders(pairs):
    scores, correct = [s for s, _ in pairs], [c for _, c in pairs]
    got = aurc(scores, correct)
    assert got == pytest.approx(brute_aurc(scores, correct))
    oracle = aurc([float(c) for c in correct], correct)  # ranking every right answer first is the best
    assert oracle <= got + 1e-12 and 0.0 <= got <= 1.0


def test_selective_summary_by_hand():
    texts = ["42", "I don't know", "41", "42"]
    got = selective_summary(texts, [True, False, False, True], [0.9, 0.99, 0.8, 0.5], _ABSTAIN)
    # the abstention ranks last despite its score: order 0 (right), 2 (wrong), 3 (right), 1 (not right)
    assert got == {"coverage": 0.75, "selective_risk": round(1 / 3, 4),
                   "aurc": round((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4, 4)}
    assert selective_summary(["I don't know"], [False], [0.5], _ABSTAIN)["selective_risk"] == 0.0


def test_calibration_summary_reads_the_stated_confidence():
    texts = ["42. Confidence: 90%", "41. confidence 0.2", "42"]  # the last states none: confidence 1
    got = calibration_summary(texts, [True, False, True], _CONFIDENCE)
    conf = [0.9, 0.2, 1.0]
    assert got["confidence_stated"] == round(2 / 3, 4)
    assert got["brier"] == round(brier_score(conf, [True, False, True]), 4)
    assert got["ece"] == round(expected_calibration_error(conf, [True, False, True]), 4)


def test_evaluate_reports_calibration_and_selective_statistics(tiny_model_path, tmp_path):
    """The tiny random model's greedy replies, a pattern it is sure to meet (any digit counts as a
    stated confidence, a reply with the letter 'a' as an abstention): the summary equals the
    statistics recomputed from the written samples."""
    from test_eval import run_eval  # the eval helper of the neighbouring module (tests/eval on sys.path)

    conf_pattern, abstain = r"(\d)", r"a"
    _, summary, samples = run_eval(tiny_model_path, tmp_path, "eval.temperature=0", "eval.n=1", "eval.k=[1]",
                                   "eval.limit=12", f"eval.confidence_pattern='{conf_pattern}'",
                                   f"eval.abstain_pattern='{abstain}'")
    texts, right = [s["completion"] for s in samples], [s["correct"] for s in samples]
    assert summary["confidence_stated"] == round(sum(bool(re.search(conf_pattern, t)) for t in texts) / 12, 4)
    conf = [1.0 if stated_confidence(t, conf_pattern)[0] is None else stated_confidence(t, conf_pattern)[0]
            for t in texts]
    assert summary["ece"] == round(expected_calibration_error(conf, right), 4)
    answered = [not re.search(abstain, t, re.IGNORECASE) for t in texts]
    assert summary["coverage"] == round(sum(answered) / 12, 4)
    assert 0.0 <= summary["aurc"] <= 1.0 and math.isfinite(summary["brier"])
    assert json.loads((tmp_path / "eval_summary.json").read_text())["ece"] == summary["ece"]
