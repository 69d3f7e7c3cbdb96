"""Numca's numeric milestones (Chen et al. 2026, *Hista and Numca*): the numbers a reply writes are states
other replies to the same prompt can reach too, so the value of reaching one is the mean correctness of the
other replies that reached it. The reward places each value change at the milestone where it happens."""
from __future__ import annotations

import re
from typing import Any

import torch

from upslope.algos.state_value import others_value
from upslope.bounds import Regex
from upslope.registry import REWARDS
from upslope.rewards.calibration import verifier
from upslope.rewards.placement import PlacedReward

_NUMBERS = r"-?\d+(?:\.\d+)?"


def milestones(text: str, pattern: str) -> list[tuple[str, int]]:
    """(the number, the character offset where it ends) of each number's first appearance, in order."""
    seen: dict[str, int] = {}
    for m in re.finditer(pattern, text):
        seen.setdefault(m.group(0), m.end())
    return list(seen.items())


def milestone_parts(text: str, own: float, others: list[tuple[set[str], float]],
                    pattern: str) -> tuple[tuple[int, float], ...]:
    """A reply's reward parts: V_0 is the other replies' mean correctness; at the k-th milestone V_k is the
    mean correctness of the other replies that wrote the same number (V_{k-1} when none did), placed as
    V_k - V_{k-1} where the number ends; the last part, own correctness - V_K, at the reply's end. They sum to
    own - V_0, so a reward-to-go at a token is own correctness minus the value of the last milestone before it."""
    if not others:
        return ((len(text), 0.0),)
    returns = torch.tensor([c for _, c in others], dtype=torch.float64)
    value = float(returns.mean())
    parts = []
    for number, end in milestones(text, pattern):
        reached = torch.tensor([float(number in nums) for nums, _ in others], dtype=torch.float64)
        new = float(others_value(returns, reached, value))
        parts.append((end, new - value))
        value = new
    return (*parts, (len(text), own - value))


def numca_places_tokens(options: dict[str, Any]) -> bool:
    """The registry trait `places_tokens`: numca always puts its parts on tokens."""
    return True


@REWARDS.register("numca", batched=True, places_tokens=numca_places_tokens)
def numca(completions: list[str], answers: list[Any], metas: list[dict], *, pattern: Regex = _NUMBERS,
          verifier_name: str = "integer", verifier_options: dict[str, Any] | None = None) -> list[PlacedReward]:
    """Numca: correctness minus the other replies' mean, its changes placed at the numbers the reply writes,
    each number valued by the mean correctness of the other replies that wrote it.

    pattern: regular expression of a numeric milestone (its match is the milestone's identity)
    verifier_name: registered reward deciding correctness (0/1)
    verifier_options: options of that reward (e.g. {extract: after_hashes, strict: true})

    Needs an advantage that takes token rewards (reinforce_pp, gae). Numca (Chen et al. 2026) uses numerical
    spans as gradable milestones for state value estimation. Here a milestone is a number's first appearance
    in the reply, compared by its text with the numbers of the other replies to the same prompt (by example id);
    its value is their mean correctness among those that wrote it; the value before any milestone is the
    mean correctness of the other replies (leave-one-out): our choices. A reward-to-go (gamma 1) then gives each
    token its reply's correctness minus the value of the last milestone before it.
    """
    check = verifier(verifier_name, verifier_options, "numca")
    correct = [float(check(c, a, m) > 0) for c, a, m in zip(completions, answers, metas)]
    numbers = [{n for n, _ in milestones(c, pattern)} for c in completions]
    groups: dict[Any, list[int]] = {}
    for i, m in enumerate(metas):
        groups.setdefault(m.get("example_id", ("sample", i)), []).append(i)
    out: list[PlacedReward] = [PlacedReward(())] * len(completions)
    for members in groups.values():
        for i in members:
            others = [(numbers[j], correct[j]) for j in members if j != i]
            out[i] = PlacedReward(milestone_parts(completions[i], correct[i], others, pattern))
    return out
