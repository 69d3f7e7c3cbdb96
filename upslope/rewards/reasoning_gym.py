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
# a minus sign counts when it does not follow a word or ")": "10-3" holds 10 and 3, "x = -3" holds -3
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is\s*:?|:)", re.IGNORECASE)  # "the answer is", "Answer:"


def _numbers(text: str) -> list[str]:
    """The numbers in `text`, in order, thousands separators dropped ("1,200" -> "1200")."""
    return [m.group().replace(",", "") for m in _NUMBER.finditer(text)]


def final_number(completion: str) -> str | None:
    """The number a worked reply ends on, read the way math verifiers read one: the number after the last
    "answer is" / "Answer:" (after that line's last "=", for "Answer: 3 + 4 = 7"), else the first number after
    the last "=", else the last number; None when the reply holds no number. A model that reasons before it
    answers rarely writes the bare number a generator's exact verifier wants, but almost always ends on it."""
    phrases = list(_ANSWER_PHRASE.finditer(completion))
    if phrases:
        line = completion[phrases[-1].end():].split("\n", 1)[0]
        found = _numbers(line.rsplit("=", 1)[-1]) or _numbers(line)
        if found:
            return found[0]
    if "=" in completion:
        found = _numbers(completion.rsplit("=", 1)[1])
        if found:
            return found[0]
    found = _numbers(completion)
    return found[-1] if found else None


def extract_answer(completion: str, extract: str) -> str | None:
    """The answer a completion gives: `tag` the last <answer>...</answer> (None without one), `tag_or_last_line`
    that or else the last non-empty line, `final_number` that or else the number a worked reply ends on (see
    `final_number`: for generators whose answers are numbers), `first_line` the text before the first </answer>
    or line break (for a reply prefilled with "<answer>"), `whole` the stripped completion."""
    if extract == "whole":
        return completion.strip()
    if extract == "first_line":
        head = completion.split("</answer>")[0].strip()
        return head.splitlines()[0].strip() if head else None
    found = _TAG.findall(completion)
    if found:
        return found[-1].strip()
    if extract == "final_number":
        return final_number(completion)
    if extract == "tag_or_last_line":
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        return lines[-1] if lines else None
    return None


@REWARDS.register("reasoning_gym")
def reasoning_gym_reward(completion: str, answer: Any, meta: dict, *,
                         extract: Literal["tag", "tag_or_last_line", "final_number", "first_line", "whole"] = "tag") -> float:
    """The reasoning-gym generator's verifier on the completion's answer (data.task=reasoning_gym).

    extract: where the answer is read: tag (<answer>...</answer>, none: 0), tag_or_last_line, final_number (the tag, else the number after a final "answer is"/"Answer:" or "=", else the last number: numeric generators), first_line (before the first </answer> or line break: a reply prefilled with <answer>), whole (the completion)
    """
    rg = meta.get("reasoning_gym")
    if not isinstance(rg, dict) or "entry" not in rg:
        raise ValueError("the reasoning_gym reward needs data.task=reasoning_gym (its examples carry the problem)")
    gen = generator(rg["dataset"], json.dumps(rg["config"], sort_keys=True), rg["seed"], rg["size"])
    return float(gen.score_answer(extract_answer(completion, extract), rg["entry"]))
