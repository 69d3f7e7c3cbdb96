"""Self-CTRL's consistency reward (*Self-Consistency Training with Reinforcement Learning*, 2026) for the
`self_report` task: a reply's stated frequency of choosing a word against how often the model chose that
word on related inputs (every reply of the batch in the same family)."""
from __future__ import annotations

import re
from typing import Any

from upslope.bounds import PositiveFraction
from upslope.registry import REWARDS


def report(text: str, meta: dict) -> tuple[str, float] | None:
    """(the word chosen, the stated percentage / 100) of a reply "word, N%", or None when either is missing or
    the word is not one of the two offered."""
    m = re.match(r"\s*([A-Za-z]+)\W+(\d{1,3})\s*%", text)
    if not m or m.group(1).lower() not in (meta["target"], meta["other"]) or int(m.group(2)) > 100:
        return None
    return m.group(1).lower(), int(m.group(2)) / 100


@REWARDS.register("self_consistency", batched=True)
def self_consistency(completions: list[str], answers: list[Any], metas: list[dict], *,
                     tolerance: PositiveFraction = 0.2) -> list[float]:
    """1 - |stated frequency - behaviour| / tolerance (at least 0): the behaviour is the share of the batch's
    well-formed replies in the reply's family that chose the word the report is about (meta `target`); a
    malformed reply earns 0 and is not counted as behaviour. Raising the reward can move either side: the
    report toward the behaviour, or the behaviour toward the report.

    tolerance: the gap between report and behaviour at which the reward reaches 0
    """
    parsed = [report(c, m) for c, m in zip(completions, metas)]
    chose: dict[str, list[str]] = {}
    for p, m in zip(parsed, metas):
        if p is not None:
            chose.setdefault(m["family"], []).append(p[0])
    out = []
    for p, m in zip(parsed, metas):
        if p is None:
            out.append(0.0)
            continue
        picks = chose[m["family"]]
        behaviour = picks.count(m["target"]) / len(picks)
        out.append(max(0.0, 1 - abs(p[1] - behaviour) / tolerance))
    return out
