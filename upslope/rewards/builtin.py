"""Built-in verifiable rewards. Signature: (completion, answer, meta, *, options) -> float."""
from __future__ import annotations

import re
from typing import Any, Literal

from upslope.bounds import PositiveCount, Regex
from upslope.registry import REWARDS
from upslope.rewards.extract import boxed, extract_integer, integers


def integer_answer(answer: Any, options: dict[str, Any] | None = None) -> int:
    """The reference integer of an `integer` reward: an int, an integral float, or its text ('1,234');
    ValueError for anything else (checked on every example before training: such an answer could
    never be matched, so its samples would only ever score the fallback)."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float, str)):
        raise ValueError(f"expected an integer or its text, got {type(answer).__name__} {answer!r}")
    if isinstance(answer, float):
        if not answer.is_integer():
            raise ValueError(f"expected an integer, got {answer!r}")
        return int(answer)
    return int(str(answer).replace(",", "").strip())


@REWARDS.register("integer", answer=integer_answer)
def integer_reward(completion: str, answer: Any, meta: dict, *,
                   extract: Literal["first", "first_result", "last", "after_equals", "boxed", "after_hashes"] = "first",
                   strict: bool = True) -> float:
    """1 if the extracted integer equals the answer. strict: the extraction strategy alone
    decides; lenient: any integer in the completion that equals the answer counts.

    extract: where the integer is read: first, first_result (first not beside an operator), last, after_equals (last '='), boxed (\\boxed{}), after_hashes ('####')
    strict: only the extracted integer counts (true), or any integer in the completion equal to the answer
    """
    target = integer_answer(answer)
    got = extract_integer(completion, extract)
    if got == target:
        return 1.0
    if not strict and target in integers(completion):
        return 1.0
    return 0.0


@REWARDS.register("exact")
def exact_reward(completion: str, answer: Any, meta: dict, *, case_sensitive: bool = False,
                 strip: bool = True) -> float:
    """1 if the completion equals the reference text.

    case_sensitive: compare case-sensitively (false: both lower-cased first)
    strip: strip surrounding whitespace from both before comparing
    """
    a, b = str(completion), str(answer)
    if strip:
        a, b = a.strip(), b.strip()
    if not case_sensitive:
        a, b = a.lower(), b.lower()
    return float(a == b)


@REWARDS.register("format")
def format_reward(completion: str, answer: Any, meta: dict, *, pattern: Regex = r"\\boxed\{.+\}",
                  full_match: bool = False) -> float:
    """1 if the completion matches a regular expression (search, or full match).

    pattern: Python regular expression (DOTALL) the completion must match
    full_match: the stripped completion must match as a whole (false: a match anywhere)
    """
    flags = re.DOTALL
    hit = re.fullmatch(pattern, completion.strip(), flags) if full_match else re.search(pattern, completion, flags)
    return float(hit is not None)


@REWARDS.register("math")
def math_reward(completion: str, answer: Any, meta: dict, *, timeout_s: PositiveCount = 5) -> float:
    """1 if math-verify finds the completion's final answer equivalent to the reference
    (numbers, fractions, LaTeX expressions; GSM8K '####' answers included).

    timeout_s: seconds math-verify may spend on each parse and on the comparison
    """
    from math_verify import parse, verify

    gold = parse(_as_latex(str(answer)), parsing_timeout=timeout_s)
    text = completion
    if "\\boxed" not in text and "####" in text:
        text = f"\\boxed{{{text.rsplit('####', 1)[1].strip()}}}"
    elif boxed(text) is None and not gold:
        return 0.0
    pred = parse(text, parsing_timeout=timeout_s)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=timeout_s))


def _as_latex(answer: str) -> str:
    """math-verify extracts LaTeX only inside $...$ or \\boxed{}: a bare reference such as
    \\sqrt{2} or \\left( 3, \\frac{\\pi}{2} \\right) would parse to nothing or to a wrong part."""
    return answer if answer.strip().startswith("$") else f"${answer}$"
