"""Label-free rewards: a reply agreeing with its group's majority answer (a self-reward for prompts
without a reference answer)."""
from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from upslope.registry import REWARDS
from upslope.rewards.extract import extract_integer

Extraction = Literal["first", "first_result", "last", "after_equals", "boxed", "after_hashes"]


@REWARDS.register("majority_vote", batched=True)
def majority_vote(completions: list[str], answers: list[Any], metas: list[dict], *,
                  extract: Extraction = "first_result") -> list[float]:
    """1 when a reply's integer is the most common integer among the replies to its prompt, else 0.

    extract: where each reply's integer is read (as the integer reward's option)

    Never reads the reference answer: the self-reward of semi-supervised and test-time RL. A reply
    with no integer scores 0 and does not vote; a tie for the most common integer goes to the one
    that appeared first. Groups are the replies with the same meta example_id.
    """
    picks = [extract_integer(c, extract) for c in completions]
    groups: dict[Any, list[int]] = {}
    for i, m in enumerate(metas):
        groups.setdefault(m.get("example_id", ("sample", i)), []).append(i)
    out = [0.0] * len(completions)
    for members in groups.values():
        votes = Counter(picks[i] for i in members if picks[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        winner = next(picks[i] for i in members if picks[i] is not None and votes[picks[i]] == top)
        for i in members:
            out[i] = float(picks[i] == winner)
    return out
