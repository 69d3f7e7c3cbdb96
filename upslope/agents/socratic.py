"""SocraticPO: after a wrong answer a teacher diagnoses it and gives short guidance,
the student answers again, and a reward earned after help is decayed (agent.hint_decay**hints). The same
rule teacher is CATPO's critique of a failed tree leaf (`arith_critique`, used by the `tree` rollout)."""
from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

from upslope.agents.env import AnswerEnv, Message, StepResult
from upslope.bounds import Count
from upslope.data.types import Example
from upslope.registry import ENVIRONMENTS
from upslope.rewards.extract import first_result


def arith_guidance(example: Example, model_turn: str) -> str:
    """A rule teacher for the arith task: the first step worked out (ones digits and carry for +, the
    product of the ones digits for *), then the question restated so the student answers it again."""
    m = example.meta
    a, b, op = m.get("a"), m.get("b"), m.get("op")
    if not isinstance(a, int) or not isinstance(b, int):
        return "That is not right. Work it out step by step and answer again."
    said = model_turn.strip().split("\n")[0][:40]
    if op == "+":
        ones = a % 10 + b % 10
        step = f"the ones digits give {a % 10} + {b % 10} = {ones}: write {ones % 10} and carry {ones // 10}"
    elif op == "*":
        step = f"the ones digits give {a % 10} * {b % 10} = {(a % 10) * (b % 10)}"
    else:
        step = f"check the ones digits first: {a % 10} {op} {b % 10}"
    return f"\"{said}\" is not right. Start from the ones: {step}. {a} {op} {b} ="


GUIDES = {"arith": arith_guidance}


def arith_critique(example: Example, tokens: Sequence[int],
                   decode: Callable[[list[int]], str]) -> tuple[int, str] | None:
    """CATPO's critique of one reply on the arith task, by rule: None when the reply is right (its first result
    is the answer, as the task's reward reads it) or the example has no operands; else (the reply's shallowest
    failure point: the first token after which its text can no longer read as the answer, and the guidance)."""
    if not isinstance(example.meta.get("a"), int) or example.answer is None:
        return None
    text = decode(list(tokens))
    if first_result(text) == int(example.answer):
        return None
    want = str(example.answer)
    bad = (t for t in range(len(tokens)) if not want.startswith(decode(list(tokens[:t + 1])).lstrip()))
    return max(next(bad, len(tokens) - 1), 0), arith_guidance(example, text)


CRITIQUES = {"arith": arith_critique}


@ENVIRONMENTS.register("socratic")
class SocraticEnv(AnswerEnv):
    """SocraticPO: AnswerEnv whose hint after a wrong answer is a teacher's diagnosis of that answer.

    reward: reward plugin that scores the final answer (1: correct)
    reward_options: its options (default for integer: extract=last, strict=true)
    hints: most rounds of guidance (each decays what is earned after it by agent.hint_decay)
    teacher: the guide: `arith` (a rule teacher that works the first step out; the paper's teacher is a
    stronger black-box model, which a judge-backed guide would stand in for)
    """

    def __init__(self, *, reward: str = "integer", reward_options: dict[str, Any] | None = None, hints: Count = 1,
                 teacher: Literal["arith"] = "arith"):
        super().__init__(reward=reward, reward_options=reward_options, hints=hints)
        self.guide = GUIDES[teacher]

    def step(self, history: list[Message], model_turn: str) -> StepResult:
        res = super().step(history, model_turn)
        if res.hint:  # the second try opens like the first (the example's prefill, e.g. "37 + 45 =")
            assert self.example is not None
            res.messages = [{"role": "user", "content": self.guide(self.example, model_turn)}]
            res.prefill = self.example.prefill
        return res
