"""Calibration rewards: a stated confidence scored so that answering wrong on purpose never pays,
and selective prediction (answer or abstain)."""
from __future__ import annotations

import re
from typing import Any, Callable, Literal

from upslope.bounds import NonNegative, Regex
from upslope.errors import ConfigError
from upslope.registry import REWARDS

_CONFIDENCE = r"confidence\s*[:=]?\s*(\d+(?:\.\d+)?)\s*(%?)"
_ABSTAIN = r"\b(?:I don't know|I do not know|abstain)\b"


def verifier(name: str, options: dict[str, Any] | None, who: str) -> Callable[[str, Any, dict], float]:
    """The registered reward `name` bound to `options`, used as the 0/1 correctness check of `who`."""
    if name == who:
        raise ConfigError(f"reward '{who}': verifier cannot be '{who}' itself")
    REWARDS.get(name, f"reward '{who}' verifier_name")
    return REWARDS.bind(name, options, where=f"reward '{who}' verifier_options")


def verifier_answer(answer: Any, options: dict[str, Any]) -> None:
    """The answer check of the reward this one uses as its verifier (`integer` by default), if it has one."""
    entry = REWARDS.get(options.get("verifier_name", "integer"))
    check = entry.traits.answer
    if check is not None:
        check(answer, options.get("verifier_options") or {})


def stated_confidence(completion: str, pattern: str) -> tuple[float | None, str]:
    """(confidence in [0, 1] or None, the completion with the statement removed) from the last match of `pattern`.

    The pattern's first group is the number, an optional second group a '%' sign; a value
    above 1 without '%' is read as a percentage as well; values are clamped to [0, 1].
    """
    matches = list(re.finditer(pattern, completion, re.IGNORECASE))
    if not matches:
        return None, completion
    m = matches[-1]
    value = float(m.group(1))
    if (m.lastindex or 0) >= 2 and m.group(2) == "%" or value > 1:
        value /= 100.0
    return min(max(value, 0.0), 1.0), completion[:m.start()] + completion[m.end():]


def brier_reward_value(correct: float, confidence: float, correct_bonus: float) -> float:
    """correct_bonus * y - (y - c)^2: Brier score plus a correctness term (non-hackable when bonus >= 1)."""
    return correct_bonus * correct - (correct - confidence) ** 2


@REWARDS.register("brier_confidence", answer=verifier_answer)
def brier_confidence(completion: str, answer: Any, meta: dict, *, verifier_name: str = "integer",
                     verifier_options: dict[str, Any] | None = None, correct_bonus: float = 1.0,
                     pattern: Regex = _CONFIDENCE,
                     missing: Literal["worst", "zero"] = "worst") -> float:
    """Calibration reward: correct_bonus * y - (y - c)^2 for correctness y and stated confidence c.

    verifier_name: registered reward deciding correctness y (0/1) on the completion minus its confidence statement
    verifier_options: options of that reward (e.g. {extract: first})
    correct_bonus: reward for a correct answer on top of the Brier term (>= 1: answering wrong on purpose never pays)
    pattern: regular expression of the confidence statement; group 1 the number, group 2 an optional '%'
    missing: a reply without a statement is scored at its worst confidence ("worst") or 0 reward ("zero")

    Tan et al. (2026) show that a scheme rewarding confidence differently when right and
    when wrong can pay a model to answer wrong on purpose and be sure of it. Here the best
    wrong reply (c = 0) earns 0 and the worst right one (c = 0) earns correct_bonus - 1, so
    with correct_bonus >= 1 a right answer at any confidence earns at least as much as any
    wrong one, and the expected reward of an answer right with probability p, stated
    honestly, is p * (correct_bonus - 1 + p) >= 0, the reward of answering wrong with c = 0.
    correct_bonus = 0 is the plain (hackable) Brier reward. The form and default are our choice.
    """
    if correct_bonus < 0:
        raise ConfigError(f"reward 'brier_confidence': correct_bonus must be >= 0 (got {correct_bonus})")
    confidence, rest = stated_confidence(completion, pattern)
    y = float(verifier(verifier_name, verifier_options, "brier_confidence")(rest, answer, meta) > 0)
    if confidence is None:
        return brier_reward_value(y, 1.0 - y, correct_bonus) if missing == "worst" else 0.0
    return brier_reward_value(y, confidence, correct_bonus)


@REWARDS.register("selective", answer=verifier_answer)
def selective(completion: str, answer: Any, meta: dict, *, verifier_name: str = "integer",
              verifier_options: dict[str, Any] | None = None, risk_penalty: NonNegative = 1.0,
              abstain_reward: float = 0.0, pattern: Regex = _ABSTAIN) -> float:
    """Selective prediction: 1 for a right answer, -risk_penalty for a wrong one, abstain_reward for abstaining.

    verifier_name: registered reward deciding correctness (0/1) of an answered reply
    verifier_options: options of that reward (e.g. {extract: first})
    risk_penalty: cost of a wrong answer (>= 0); answering pays when P(right) > (penalty + abstain) / (1 + penalty)
    abstain_reward: reward for abstaining (between -risk_penalty and 1, so abstaining beats only a likely error)
    pattern: regular expression (case-insensitive) that marks a reply as an abstention

    RLSR (Luo et al. 2026) aligns to the area under the risk-coverage curve. This per-sample
    reward keeps its trade-off (coverage against risk) without ranking a batch: a policy
    maximising it answers exactly the questions whose chance of being right is above the
    threshold, so the risk on what it answers falls as the penalty rises. The per-sample
    form is our choice; a wrong answer never earns more than an abstention.
    """
    if risk_penalty < 0 or not -risk_penalty <= abstain_reward <= 1:
        raise ConfigError(f"reward 'selective': need risk_penalty >= 0 and -risk_penalty <= abstain_reward <= 1 "
                          f"(got {risk_penalty}, {abstain_reward})")
    if re.search(pattern, completion, re.IGNORECASE):
        return abstain_reward
    right = verifier(verifier_name, verifier_options, "selective")(completion, answer, meta) > 0
    return 1.0 if right else -risk_penalty
