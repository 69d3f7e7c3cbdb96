"""Fixtures of the agent tests: real multi-turn trajectories of the tiny model through the real
HF engine and the real SmolLM2 tokenizer, in an environment that answers every turn."""
from __future__ import annotations

import pytest

from agent_helpers import ECHO, echo_config
from upslope.rollout.multi_turn import AgentRun, multi_turn
from upslope.data.tasks import arith
from upslope.engine import SamplingParams

PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=96, seed=3, stop_token_ids=[2])


@pytest.fixture(scope="session")
def agent_run(tokenizer) -> AgentRun:
    """The echo environment with the calculator offered, 3 turns of at most 6 tokens each."""
    assert ECHO
    return AgentRun(echo_config(), tokenizer)


@pytest.fixture(scope="session")
def agent_batch(agent_run, hf_engine):
    """2 prompts x 3 trajectories of the tiny model, each with environment turns between model turns."""
    examples = arith(split="test", count=2, digits=3)
    return multi_turn(hf_engine, [], examples, PARAMS, pad_id=2, run=agent_run), examples
