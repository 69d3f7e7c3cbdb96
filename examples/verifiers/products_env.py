"""A verifiers environment written in the package's documented style (a dataset, a rubric of reward
functions, a MultiTurnEnv whose env_response answers the model, a stop condition): one-digit products; a
wrong reply is answered with a request to try again, once. The eval dataset holds products the training
dataset does not.

    data: {task: verifiers, options: {env: examples/verifiers/products_env.py}}
    rollout: {kind: openai_agent, options: {agent: "upslope.agents.verifiers_env:program"}}

(recipes/verifiers_products.yaml). It needs the verifiers package (0.1.x); nothing in it knows upslope."""
from __future__ import annotations

import random
import re

from datasets import Dataset

import verifiers as vf

INTEGER = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    found = INTEGER.findall(text or "")
    return int(found[-1]) if found else None


class RetryOnce(vf.MultiTurnEnv):
    """A wrong reply gets one more chance."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "That is not right. Try again: reply with only the number."}]

    @vf.stop
    async def answered(self, state, **kwargs) -> bool:
        steps = state["trajectory"]
        return bool(steps) and last_integer(steps[-1]["completion"][-1]["content"]) == int(state["answer"])


def correct(completion, answer, **kwargs) -> float:
    """The final reply's last integer is the product."""
    return float(last_integer(completion[-1]["content"]) == int(answer))


def load_environment(num_eval: int = 24, max_turns: int = 2, seed: int = 0) -> vf.Environment:
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(seed).shuffle(pairs)
    rows = [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in pairs]
    return RetryOnce(dataset=Dataset.from_list(rows[num_eval:]), eval_dataset=Dataset.from_list(rows[:num_eval]),
                     rubric=vf.Rubric(funcs=[correct]), max_turns=max_turns)
