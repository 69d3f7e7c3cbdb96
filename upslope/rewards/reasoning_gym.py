"""The `reasoning_gym` reward: a reasoning-gym generator's own verifier scores the answer a completion
gives (by default the text between <answer> and </answer>, reasoning-gym's convention). Scores are the
verifier's: 1 for a right answer, partial credit where the generator gives it."""
from __future__ import annotations

import json
import re
from typing import Any, Literal

from upslope.data.reasoning_gym import generator
from upslope.registry import REWARDS

_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_answer(completion: str, extract: str) -> str | None:
    """The answer a completion gives: `tag` the last <answer>...</answer> (None without one), `tag_or_last_line`
    that or else the last non-empty line, `first_line` the text before the first </answer> or line break (for a
    reply prefilled with "<answer>"), `whole` the stripped completion."""
    if extract == "whole":
        return completion.strip()
    if extract == "first_line":
        head = completion.split("</answer>")[0].strip()
        return head.splitlines()[0].strip() if head else None
    found = _TAG.findall(completion)
    if found:
        return found[-1].strip()
    if extract == "tag_or_last_line":
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        return lines[-1] if lines else None
    return None


@REWARDS.register("reasoning_gym")
def reasoning_gym_reward(completion: str, answer: Any, meta: dict, *,
                         extract: Literal["tag", "tag_or_last_line", "first_line", "whole"] = "tag") -> float:
    """The reasoning-gym generator's verifier on the completion's answer (data.task=reasoning_gym).

    extract: where the answer is read: tag (<answer>...</answer>, none: 0), tag_or_last_line, first_line (before the first </answer> or line break: a reply prefilled with <answer>), whole (the completion)
    """
    rg = meta.get("reasoning_gym")
    if not isinstance(rg, dict) or "entry" not in rg:
        raise ValueError("the reasoning_gym reward needs data.task=reasoning_gym (its examples carry the problem)")
    gen = generator(rg["dataset"], json.dumps(rg["config"], sort_keys=True), rg["seed"], rg["size"])
    return float(gen.score_answer(extract_answer(completion, extract), rg["entry"]))
