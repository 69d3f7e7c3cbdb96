"""DiScO's diversity reward: each reply's thinking schema (its reasoning transitions and its answer
candidates) compared with the other replies to the same prompt, a reply with a rarer schema scoring
higher."""
from __future__ import annotations

import re
from typing import Any

from upslope.bounds import Regex
from upslope.registry import REWARDS
from upslope.rewards.calibration import verifier

_TRANSITIONS = r"\b(?:wait|but|however|alternatively|so|therefore|thus|check|verify|let me|instead|actually)\b"
_CANDIDATES = r"=\s*(-?\d+(?:\.\d+)?)"


def schema(text: str, transitions: str, candidates: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A reply's thinking schema: its reasoning transitions in order (the matched words, lower case)
    and its answer candidates (group 1 of each `candidates` match, or the match) in order of first
    appearance."""
    moves = tuple(m.group(0).lower() for m in re.finditer(transitions, text, re.IGNORECASE))
    found = [(m.group(1) if m.groups() else m.group(0)) for m in re.finditer(candidates, text)]
    return moves, tuple(dict.fromkeys(found))


@REWARDS.register("disco_diversity", batched=True)
def disco_diversity(completions: list[str], answers: list[Any], metas: list[dict], *,
                    transitions: Regex = _TRANSITIONS, candidates: Regex = _CANDIDATES, only_correct: bool = True,
                    verifier_name: str = "integer", verifier_options: dict[str, Any] | None = None) -> list[float]:
    """DiScO: the share of the other replies to the same prompt whose thinking schema differs from this one's.

    transitions: regular expression (case-insensitive) of a reasoning transition; a reply's sequence of them is half its schema
    candidates: regular expression of an answer candidate (group 1 the candidate); their sequence is the other half
    only_correct: pay the bonus only to right replies (a diverse wrong reply earns 0)
    verifier_name: registered reward deciding correctness (0/1) when only_correct
    verifier_options: options of that reward (e.g. {extract: first_result})

    In [0, 1]: 1 when no other reply of the group shares the schema, 0 when all do (a group of one
    earns 0). DiScO (Liang et al. 2026) defines a thinking schema as a reply's reasoning transitions
    and its answer candidates, and rewards their diversity within a GRPO group; the abstract does not
    say how schemata are read or compared. Here they are read by two regular expressions (transition
    words; numbers after '=') and compared exactly, and the bonus goes to right replies only, so
    diversity is never bought with a wrong answer: both our choices. Add it beside the correctness
    reward with a weight below 1.
    """
    check = verifier(verifier_name, verifier_options, "disco_diversity") if only_correct else None
    schemata = [schema(c, transitions, candidates) for c in completions]
    groups: dict[Any, list[int]] = {}
    for i, m in enumerate(metas):
        groups.setdefault(m.get("example_id", ("sample", i)), []).append(i)
    out = [0.0] * len(completions)
    for members in groups.values():
        if len(members) < 2:
            continue
        for i in members:
            if check is not None and not check(completions[i], answers[i], metas[i]) > 0:
                continue
            same = sum(schemata[j] == schemata[i] for j in members if j != i)
            out[i] = 1.0 - same / (len(members) - 1)
    return out
