"""Gymnasium-style text environments (`step(action) -> observation, reward, done`) as upslope
environments, so they train through the multi-turn rollouts unchanged.

`skyrl_gym`: SkyRL-gym's text environments (`BaseTextEnv`: `init(prompt) -> (messages, info)`,
`step(text) -> {observations, reward, done, metadata}`), by their id in skyrl_gym's registry (gsm8k,
gsm8k_multi_turn, aime, ...) or as 'module:Class' / 'file.py:Class'. Each trajectory makes its own
environment with the example's answer as `extras["reward_spec"]["ground_truth"]` and its fields as
`extras["extra_info"]`, as SkyRL's own datasets give them. A step's reward is added to the part
`reward` (per-turn rewards sum to the trajectory's return). The package is optional: pip install
skyrl-gym (upslope's extra `gym`)."""
from __future__ import annotations

from typing import Any

from upslope.agents.env import Environment, Message, StepResult
from upslope.errors import ConfigError
from upslope.registry import ENVIRONMENTS


def _skyrl() -> Any:
    try:
        import skyrl_gym
    except ModuleNotFoundError:
        raise ConfigError("agent.env=skyrl_gym needs the skyrl-gym package: pip install skyrl-gym (or upslope[gym])") \
            from None
    return skyrl_gym


def skyrl_factory(env: str) -> Any:
    """A callable (env_config=..., extras=...) -> environment for a skyrl_gym id or a 'module:Class' reference."""
    skyrl_gym = _skyrl()
    if ":" in env:
        from upslope.rewards.user import load_user_function

        return load_user_function(env, "agent.env.options.env")
    if env not in skyrl_gym.registry:
        import difflib

        near = difflib.get_close_matches(env, list(skyrl_gym.registry), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise ConfigError(f"agent.env.options.env: skyrl_gym has no environment '{env}'{hint}; registered: "
                          f"{', '.join(sorted(skyrl_gym.registry))} (or give 'module:Class')")
    return lambda **kw: skyrl_gym.make(env, **kw)


@ENVIRONMENTS.register("skyrl_gym")
class SkyRLGym(Environment):
    """A SkyRL-gym text environment: its init gives the first messages, its step answers each model turn with observations, a reward and done.

    env: the environment's id in skyrl_gym's registry (gsm8k, gsm8k_multi_turn, aime, ...) or 'module:Class' / 'file.py:Class'
    env_config: the environment's env_config (SkyRL's per-environment settings)
    extras: entries added to its extras (besides reward_spec.ground_truth, the example's answer, and extra_info, its fields)
    """

    reward_names = ("reward",)

    def __init__(self, *, env: str = "gsm8k", env_config: dict[str, Any] | None = None,
                 extras: dict[str, Any] | None = None):
        self.make = skyrl_factory(env)
        self.name = env
        self.env_config, self.extras = dict(env_config or {}), dict(extras or {})
        self.env: Any = None

    def reset(self, example: Any) -> list[Message]:
        from omegaconf import OmegaConf  # SkyRL's environments read their env_config as an OmegaConf config

        self.example = example
        extras = {"reward_spec": {"ground_truth": str(example.answer)}, "extra_info": dict(example.meta),
                  **self.extras}
        self.env = self.make(env_config=OmegaConf.create(self.env_config), extras=extras)
        messages, _ = self.env.init(example.messages())
        return [dict(m) for m in messages]

    def step(self, history: list[Message], model_turn: str) -> StepResult:
        out = self.env.step(model_turn)
        done = bool(out["done"])
        if done:
            self.env.close()
        return StepResult([dict(m) for m in out.get("observations") or []], done=done,
                          reward_parts={"reward": float(out["reward"] or 0.0)})
