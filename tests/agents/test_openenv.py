"""OpenEnv environments through the multi-turn rollout (agent.env=openenv): an environment written in OpenEnv's
documented style (Action and Observation models, an Environment subclass with reset, step and state) driven
turn by turn in this process, trained on real trajectories (tiny model, HF engine), and served by OpenEnv's
own HTTP/WebSocket server with the adapter as its client; bad options as one line."""
from __future__ import annotations

import socket
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("openenv.core")

from upslope.agents.gym_envs import OpenEnv  # noqa: E402
from upslope.config import AgentConfig, Plugin  # noqa: E402
from upslope.data.tasks import arith  # noqa: E402
from upslope.engine import SamplingParams  # noqa: E402
from upslope.errors import ConfigError  # noqa: E402
from upslope.registry import ENVIRONMENTS  # noqa: E402
from upslope.rollout.multi_turn import AgentRun, multi_turn  # noqa: E402

# as OpenEnv's environment template writes one: models, then the environment
GUESS_ENV = '''
from typing import Any, Optional
from uuid import uuid4

from pydantic import Field

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    message: str = Field(..., description="the guess")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="what the environment says about the guess")


class GuessEnvironment(Environment):
    """Guess the task's answer; after a wrong guess it says too low or too high, three guesses at most."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_guesses: int = 3):
        self.max_guesses = max_guesses
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.target = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.target = int(kwargs["task"]["answer"])
        return GuessObservation(feedback=f"guess a number ({kwargs['task']['prompt']})", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        numbers = [int(t) for t in action.message.replace(",", " ").split() if t.lstrip("-").isdigit()]
        guess = numbers[-1] if numbers else None
        if guess == self.target or self._state.step_count >= self.max_guesses:
            return GuessObservation(feedback="", done=True, reward=float(guess == self.target))
        hint = "no number" if guess is None else ("too low" if guess < self.target else "too high")
        return GuessObservation(feedback=f"{hint}, try again", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        CLOSED.append(self._state.episode_id)


CLOSED = []
'''


@pytest.fixture()
def guess_env(tmp_path) -> str:
    (tmp_path / "guess_env.py").write_text(textwrap.dedent(GUESS_ENV))
    return f"{tmp_path}/guess_env.py:GuessEnvironment"


def play(env: OpenEnv, answer: int) -> list:
    """Three turns: a wrong guess, no number, the answer."""
    return [env.step([], "0"), env.step([], "hmm"), env.step([], f"It is {answer}")]


def test_an_openenv_environment_turn_by_turn(guess_env):
    env = ENVIRONMENTS.bind("openenv", {"env": guess_env, "observation_field": "feedback",
                                        "first_message": "observation"})()
    ex = arith(split="test", count=1)[0]
    assert env.reset(ex) == [{"role": "user", "content": f"guess a number ({ex.prompt})"}]
    low, none, right = play(env, ex.answer)
    assert low.messages == [{"role": "user", "content": "too low, try again"}] and not low.done
    assert none.messages[0]["content"] == "no number, try again" and none.reward_parts == {"reward": 0.0}
    assert right.done and right.messages == [] and right.reward_parts == {"reward": 1.0}
    every_field = ENVIRONMENTS.bind("openenv", {"env": guess_env})()  # default: the example's prompt, all fields
    assert every_field.reset(ex) == ex.messages()
    assert every_field.step([], "0").messages == [{"role": "user", "content": "feedback: too low, try again"}]


def test_an_openenv_environment_trains_through_multi_turn(guess_env, tokenizer, hf_engine):
    cfg = AgentConfig(env=Plugin(name="openenv", options={"env": guess_env, "observation_field": "feedback",
                                                          "env_args": {"max_guesses": 2}}),
                      max_turns=3, max_turn_tokens=6)
    params = SamplingParams(n=2, max_new_tokens=60, seed=1, stop_token_ids=[2])
    batch = multi_turn(hf_engine, [], arith(split="test", count=2), params, 2, run=AgentRun(cfg, tokenizer))
    assert batch.size == 4
    env_class = ENVIRONMENTS.bind("openenv", {"env": guess_env})().classes[0]  # the class the rollout used
    closed = env_class.close.__globals__["CLOSED"]
    assert len(closed) == 4  # every trajectory's environment, once
    one_turn = cfg.model_copy(update={"max_turns": 1})  # trajectories cut by the turn limit, not done: closed too
    multi_turn(hf_engine, [], arith(split="test", count=2), params, 2, run=AgentRun(one_turn, tokenizer))
    assert len(closed) == 8
    for m, mask in zip(batch.meta, batch.loss_mask):  # a random model guesses wrong twice: the environment ends it
        assert m["metrics"]["agent/turns"] == 2 and m["reward_parts"] == {"reward": 0.0}
        assert [msg["content"] for msg in m["messages"] if msg["role"] == "user"][1].endswith("try again")
        assert 0 < int(mask.sum()) < int(batch.attention_mask[0].sum())  # the environment's turn is not trained


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_openenv_server_through_its_own_client(guess_env):
    """OpenEnv's own server (create_fastapi_app under uvicorn) with the adapter as its client: one session per
    trajectory, the same turns as in process."""
    import uvicorn
    from openenv.core.env_server import create_fastapi_app

    from upslope.rewards.user import load_user_function

    cls = load_user_function(guess_env, "test")
    module = sys.modules[cls.__module__]
    app = create_fastapi_app(cls, module.GuessAction, module.GuessObservation, max_concurrent_envs=4)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        ex = arith(split="test", count=1)[0]
        envs = [ENVIRONMENTS.bind("openenv", {"base_url": f"http://127.0.0.1:{port}", "observation_field": "feedback",
                                              "first_message": "observation"})() for _ in range(2)]
        assert [e.reset(ex)[0]["content"] for e in envs] == [f"guess a number ({ex.prompt})"] * 2
        low, none, right = play(envs[0], ex.answer)
        assert envs[1].step([], str(ex.answer)).reward_parts == {"reward": 1.0}  # its own session
        assert low.messages[0]["content"] == "too low, try again" and none.messages[0]["content"].startswith("no number")
        assert right.done and right.reward_parts == {"reward": 1.0}
        for e in envs:
            e.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_openenv_bad_options_are_one_line(guess_env):
    with pytest.raises(ConfigError, match="give the environment as options.env .* or options.base_url"):
        ENVIRONMENTS.bind("openenv", {})()
    with pytest.raises(ConfigError, match="observation has no field 'text'; its fields: done, reward, metadata, feedback"):
        env = ENVIRONMENTS.bind("openenv", {"env": guess_env, "observation_field": "text"})()
        env.reset(arith(split="test", count=1)[0])
        env.step([], "0")
