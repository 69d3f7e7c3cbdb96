"""Calibration and selective-prediction statistics of an evaluation: expected calibration error and
Brier score of stated confidences, coverage, selective risk and the area under the risk-coverage
curve (AURC)."""
from __future__ import annotations

import math
import re
from itertools import groupby
from typing import Any, Sequence

from upslope.rewards.calibration import stated_confidence


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """sum over equal-width confidence bins of |bin| / N * |accuracy - mean confidence| (the last bin
    includes 1.0); 0 for no samples."""
    if not confidence:
        return 0.0
    members: dict[int, list[int]] = {}
    for i, c in enumerate(confidence):
        members.setdefault(min(int(c * bins), bins - 1), []).append(i)
    total = 0.0
    for idx in members.values():
        acc = sum(bool(correct[i]) for i in idx) / len(idx)
        conf = sum(confidence[i] for i in idx) / len(idx)
        total += len(idx) * abs(acc - conf)
    return total / len(confidence)


def brier_score(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    """Mean of (confidence - correct)^2 (0 for no samples)."""
    return sum((c - float(y)) ** 2 for c, y in zip(confidence, correct)) / len(confidence) if confidence else 0.0


def aurc(scores: Sequence[float], correct: Sequence[bool]) -> float:
    """Area under the risk-coverage curve: (1 / N) sum_k errors among the k highest-scored / k.

    Samples with equal scores are in random order, so the errors among the first k of a tie
    are their expectation (the tie's error rate times how many of it are taken): the value
    does not depend on the order the samples came in. Lower is better; 0 for no samples.
    """
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    total, errors, k = 0.0, 0.0, 0
    for _, tie in groupby(order, key=lambda i: scores[i]):
        members = list(tie)
        rate = sum(not correct[i] for i in members) / len(members)
        for j in range(1, len(members) + 1):
            total += (errors + rate * j) / (k + j)
        errors += rate * len(members)
        k += len(members)
    return total / len(scores) if scores else 0.0


def calibration_summary(completions: Sequence[str], correct: Sequence[bool], pattern: str) -> dict[str, float]:
    """ece, brier and confidence_stated of the confidences the completions state (`pattern`, as the
    brier_confidence reward reads it); a completion stating none counts as confidence 1.0, an
    answer given without hedging."""
    stated = [stated_confidence(c, pattern)[0] for c in completions]
    conf = [1.0 if c is None else c for c in stated]
    return {"ece": round(expected_calibration_error(conf, correct), 4), "brier": round(brier_score(conf, correct), 4),
            "confidence_stated": round(sum(c is not None for c in stated) / max(len(stated), 1), 4)}


def selective_summary(completions: Sequence[str], correct: Sequence[bool], scores: Sequence[float],
                      pattern: str) -> dict[str, Any]:
    """coverage (share not abstaining, `pattern`), selective_risk (error rate of the answered; 0 when
    none is) and aurc, ranking answers by `scores` (e.g. exp of the mean token log-prob) and
    abstentions below every answer (an abstention is not a right answer)."""
    abstained = [bool(re.search(pattern, c, re.IGNORECASE)) for c in completions]
    answered = [ok for ok, a in zip(correct, abstained) if not a]
    scores = [-math.inf if a else s for s, a in zip(scores, abstained)]
    right = [bool(ok) and not a for ok, a in zip(correct, abstained)]
    return {"coverage": round(len(answered) / max(len(completions), 1), 4),
            "selective_risk": round(sum(not ok for ok in answered) / len(answered), 4) if answered else 0.0,
            "aurc": round(aurc(scores, right), 4)}
