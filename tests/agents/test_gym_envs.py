"""Gym-style text environments through the multi-turn rollout: SkyRL-gym's own gsm8k_multi_turn driven turn
by turn and on real trajectories (tiny model, HF engine), an environment written in SkyRL's documented
style given as 'file.py:Class', and a wrong id as one line."""
from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("skyrl_gym")

from upslope.rollout.multi_turn import AgentRun, multi_turn  # noqa: E402
from upslope.config import AgentConfig, Plugin  # noqa: E402
from upslope.data.tasks import arith  # noqa: E402
from upslope.errors import ConfigError  # noqa: E402
from upslope.registry import ENVIRONMENTS  # noqa: E402
from upslope.engine import SamplingParams  # noqa: E402

GUESS_ENV = '''
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class GuessEnv(BaseTextEnv):
    """Guess the answer; after a wrong guess the environment says whether it was too low or too high."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.target = int(extras["reward_spec"]["ground_truth"])
        self.max_turns = env_config.get("max_turns", 3) if env_config else 3

    def step(self, action):
        self.turns += 1
        digits = [int(t) for t in action.replace(",", " ").split() if t.lstrip("-").isdigit()]
        guess = digits[-1] if digits else None
        if guess == self.target or self.turns >= self.max_turns:
            return BaseTextEnvStepOutput(observations=[], reward=float(guess == self.target), done=True, metadata={})
        hint = "no number" if guess is None else ("too low" if guess < self.target else "too high")
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": f"{hint}, try again"}], reward=0.0,
                                     done=False, metadata={})
'''


def test_skyrl_gsm8k_multi_turn_turn_by_turn():
    env = ENVIRONMENTS.bind("skyrl_gym", {"env": "gsm8k_multi_turn", "extras": {"max_turns": 3}})()
    ex = arith(split="test", count=1)[0]
    assert env.reset(ex) == [{"role": "user", "content": ex.prompt}]
    wrong = env.step([], f"It is #### {ex.answer + 1}")
    assert not wrong.done and "#### ANSWER" in wrong.messages[0]["content"] and 0 < wrong.reward_parts["reward"] < 0.5
    right = env.step([], f"So #### {ex.answer}")
    assert right.done and right.reward_parts == {"reward": 1.0} and right.messages == []


def test_a_skyrl_style_env_from_a_file_trains_through_multi_turn(tmp_path, tokenizer, hf_engine):
    (tmp_path / "guess_env.py").write_text(textwrap.dedent(GUESS_ENV))
    env = ENVIRONMENTS.bind("skyrl_gym", {"env": f"{tmp_path}/guess_env.py:GuessEnv", "env_config": {"max_turns": 3}})()
    ex = arith(split="test", count=1)[0]
    env.reset(ex)
    assert env.step([], "0").messages[0]["content"] == "too low, try again"
    assert env.step([], str(ex.answer)).reward_parts == {"reward": 1.0}
    cfg = AgentConfig(env=Plugin(name="skyrl_gym", options={"env": f"{tmp_path}/guess_env.py:GuessEnv"}),
                      max_turns=3, max_turn_tokens=6)
    batch = multi_turn(hf_engine, [], arith(split="test", count=2), SamplingParams(n=2, max_new_tokens=60, seed=1,
                       stop_token_ids=[2]), 2, run=AgentRun(cfg, tokenizer))
    assert batch.size == 4
    for m in batch.meta:  # a random model guesses wrong: three turns, the environment's feedback between them
        assert m["metrics"]["agent/turns"] == 3 and set(m["reward_parts"]) == {"reward"}
        assert any("try again" in msg["content"] for msg in m["messages"] if msg["role"] == "user")


def test_an_unknown_skyrl_environment_is_one_line():
    with pytest.raises(ConfigError, match="skyrl_gym has no environment 'gsm8k_multiturn'.*did you mean 'gsm8k_multi_turn'"):
        ENVIRONMENTS.bind("skyrl_gym", {"env": "gsm8k_multiturn"})()
