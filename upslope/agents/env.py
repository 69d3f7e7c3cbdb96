"""The environment API of multi-turn rollouts, and the built-in `answer` environment.

An environment is a class registered in ENVIRONMENTS; the rollout makes one instance per
trajectory (its keyword-only __init__ parameters are its options, from agent.env.options):

    reset(example) -> the first messages (default: the example's prompt)
    step(history, model_turn) -> StepResult(messages to append, done, reward parts, hint)

A single-turn task is the one-step case: step returns done=True with the reward parts.
`self.toolbox` (set by the rollout) runs the tool calls of a turn: `self.toolbox.run(turn)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from upslope.bounds import Count
from upslope.registry import ENVIRONMENTS, REWARDS

if TYPE_CHECKING:
    from upslope.agents.tools import ToolBox
    from upslope.data.types import Example

Message = dict[str, Any]


@dataclass
class StepResult:
    """What the environment answers to one model turn. `hint`: the messages are guidance after a
    wrong answer (reward parts earned after k hints are multiplied by agent.hint_decay**k).
    `prefill`: text the next model turn starts with (environment tokens: masked, not trained)."""

    messages: list[Message] = field(default_factory=list)
    done: bool = True
    reward_parts: dict[str, float] = field(default_factory=dict)
    hint: bool = False
    prefill: str = ""


class Environment:
    """Base class of environments: override `step` (and `reset` for a custom first prompt)."""

    reward_names: tuple[str, ...] = ("correct",)  # every reward part step may return (missing ones count 0)
    tools: Sequence[Callable[..., Any]] = ()  # the environment's own tools (agent.tools replaces them)
    toolbox: "ToolBox | None" = None  # set by the rollout before reset
    example: "Example | None" = None

    def reset(self, example: "Example") -> list[Message]:
        """Start a trajectory on `example`: the first messages (the example's prompt)."""
        self.example = example
        return example.messages()

    def step(self, history: list[Message], model_turn: str) -> StepResult:
        """Answer one model turn (`history` already ends with it)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this trajectory's environment holds (a session, a process); called once, when the
        trajectory ends, done or not."""


def answer_check(reward: str, options: dict[str, Any]) -> Callable[..., Any]:
    """A registered reward used as the environment's verifier (e.g. integer with extract=last)."""
    return REWARDS.bind(reward, options, where="agent.env.options.reward_options")


@ENVIRONMENTS.register("answer")
class AnswerEnv(Environment):
    """Tool calls run and their results come back; a turn without one is the final answer, scored
    by a reward plugin against the example's answer. Optional hints after a wrong answer.

    reward: reward plugin that scores the final answer (1: correct)
    reward_options: its options (default for integer: extract=last, strict=true)
    hints: most hints given after wrong answers (0: the first answer ends the trajectory)
    hint: the guidance message (a user turn)
    tool_bonus: reward part `tool` for a trajectory with at least one valid tool call (0: no such part)
    after_tools: a user message sent after the tool results (e.g. a reminder to state the answer; "": none)
    answer_prefix: text the model's turn after tool results starts with (masked), e.g. "The answer is"
    """

    def __init__(self, *, reward: str = "integer", reward_options: dict[str, Any] | None = None, hints: Count = 0,
                 hint: str = "That is not right. Use a tool to check, then answer again.",
                 tool_bonus: float = 0.0, after_tools: str = "", answer_prefix: str = ""):
        opts = reward_options if reward_options is not None else ({"extract": "last"} if reward == "integer" else {})
        self.check = answer_check(reward, opts)
        self.hints, self.hint, self.tool_bonus, self.after_tools = hints, hint, tool_bonus, after_tools
        self.answer_prefix = answer_prefix
        self.given = 0
        self.reward_names = ("correct", "tool") if tool_bonus else ("correct",)

    def step(self, history: list[Message], model_turn: str) -> StepResult:
        assert self.toolbox is not None and self.example is not None
        turn = self.toolbox.run(model_turn)
        if turn.calls:
            nudge = [{"role": "user", "content": self.after_tools}] if self.after_tools else []
            return StepResult(turn.messages + nudge, done=False, prefill=self.answer_prefix)
        correct = float(self.check(model_turn, self.example.answer, self.example.meta))
        parts = {"correct": correct}
        if self.tool_bonus:
            parts["tool"] = self.tool_bonus * float(self.toolbox.valid > 0)
        if correct < 1 and self.given < self.hints:
            self.given += 1
            return StepResult([{"role": "user", "content": self.hint}], done=False, hint=True)
        return StepResult([], done=True, reward_parts=parts)


@REWARDS.register("env")
def env_reward(completion: str, answer: Any, meta: dict, *, part: str | None = None) -> Any:
    """The reward parts the environment gave a multi-turn trajectory (hint decay applied).

    part: one part only (default: every part, as components env/<part>)
    """
    parts = meta.get("reward_parts")
    if parts is None:
        raise ValueError("no environment reward parts: the env reward needs rollout.kind=multi_turn")
    return parts[part] if part else dict(parts)
