"""An environment for the agent tests: it answers every model turn with a tool-style message
and scores the turn by a property of its text, so a random model still yields multi-turn
trajectories with rewards that differ within a group."""
from __future__ import annotations

from upslope.agents import Environment, StepResult
from upslope.config import AgentConfig, Plugin
from upslope.registry import ENVIRONMENTS


@ENVIRONMENTS.register("echo_test")
class EchoEnv(Environment):
    """Replies to each turn with its length; done after `turns` turns; correct when the text length is even."""

    def __init__(self, *, turns: int = 3):
        self.turns, self.seen = turns, 0

    def step(self, history, model_turn):
        self.seen += 1
        done = self.seen >= self.turns
        parts = {"correct": float(len(model_turn) % 2 == 0)} if done else {}
        return StepResult([{"role": "tool", "content": f"turn {self.seen}: {len(model_turn)} characters"}],
                          done=done, reward_parts=parts)


ECHO = "echo_test"


def echo_config(**extra) -> AgentConfig:
    return AgentConfig(env=Plugin(name=ECHO), tools=[Plugin(name="calculator")], max_turns=3, max_turn_tokens=6,
                       **extra)


@ENVIRONMENTS.register("hint_test")
class HintEnv(Environment):
    """A hint after the first turn (starting the next turn with "Answer:"), then a correct answer: the
    reward shows the hint decay."""

    def __init__(self):
        self.seen = 0

    def step(self, history, model_turn):
        self.seen += 1
        if self.seen == 1:
            return StepResult([{"role": "user", "content": "Try again."}], done=False, hint=True, prefill="Answer:")
        return StepResult([], done=True, reward_parts={"correct": 1.0})


@ENVIRONMENTS.register("tool_test")
class ToolTurnEnv(Environment):
    """Runs one calculator call per turn through its toolbox (as if the turn had written it), done after
    two turns, correct: so the SFT term has valid tool-call turns of a successful trajectory to mark."""

    CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'

    def __init__(self):
        self.seen = 0

    def step(self, history, model_turn):
        self.seen += 1
        if self.seen == 1:
            return StepResult(self.toolbox.run(self.CALL).messages, done=False)
        return StepResult([], done=True, reward_parts={"correct": 1.0})
