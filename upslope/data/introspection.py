"""The `self_report` task (after Self-CTRL, *Self-Consistency Training with Reinforcement Learning*, 2026): the
model picks one of two words "at random" and states how often it picks the first; its behaviour is measured
on related inputs (the same pair in either order and in two phrasings: one family), so a self-report can be
checked against what the model does (the `self_consistency` reward).
"""
from __future__ import annotations

import itertools
import random

from upslope.bounds import Fraction
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.registry import TASKS

WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle", "forest", "rocket", "mirror",
         "garden", "button", "planet", "violin", "pepper"]
PHRASINGS = ["Choose one word at random: {a} or {b}. Then say how often you choose {a}, as a percentage.",
             "Pick {a} or {b}, at random. Then estimate the percentage of times you pick {a}."]
EXAMPLE = PHRASINGS[0].format(a="sun", b="moon") + "\nAnswer: moon, 40%\n\n"


@TASKS.register("self_report", reward="self_consistency", max_new_tokens=8, splits=("train", "test"))
def self_report(*, split: str = "train", seed: int = 0, test_fraction: Fraction = 0.25,
                prompt: str = EXAMPLE + "{question}", prefill: str = "Answer:") -> list[Example]:
    """Two-word choices with a self-report: every unordered pair of the word list is a family of four prompts
    (both orders, two phrasings); meta holds the family, the word the report is about (`target`) and the
    other word. Families, not prompts, are split, so no held-out pair is seen in training.

    split: "train" or "test"
    seed: seeds which families are held out
    test_fraction: share of the families held out
    prompt: format string with {question}; the default opens with one worked example
    prefill: text the reply starts with
    """
    if split not in ("train", "test"):
        raise DataError(f"data.split={split!r}: task 'self_report' has only the splits train, test")
    pairs = list(itertools.combinations(WORDS, 2))
    random.Random(seed).shuffle(pairs)
    cut = round(len(pairs) * test_fraction)
    out = []
    for x, y in pairs[:cut] if split == "test" else pairs[cut:]:
        for (a, b), k in itertools.product(((x, y), (y, x)), range(len(PHRASINGS))):
            out.append(Example(prompt=prompt.format(question=PHRASINGS[k].format(a=a, b=b)), answer=a,
                               meta={"family": f"{x}|{y}", "target": a, "other": b, "prefill": prefill},
                               id=f"self_report-{split}-{x}-{y}-{a}-{k}", prefill=prefill))
    return out
