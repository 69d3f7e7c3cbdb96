"""Gymnasium-style text environments (`step(action) -> observation, reward, done`) as upslope
environments, so they train through the multi-turn rollouts unchanged.

One adapter, `GymTextEnv`: a model turn is the action, the observations that come back are the next
messages, a step's reward is added to the part `reward` (per-turn rewards sum to the trajectory's
return), and `done` ends the trajectory. Each package binds it to its own API:

`skyrl_gym`: SkyRL-gym's text environments (`BaseTextEnv`: `init(prompt) -> (messages, info)`,
`step(text) -> {observations, reward, done, metadata}`), by their id in skyrl_gym's registry (gsm8k,
gsm8k_multi_turn, aime, ...) or as 'module:Class' / 'file.py:Class'. Each trajectory makes its own
environment with the example's answer as `extras["reward_spec"]["ground_truth"]` and its fields as
`extras["extra_info"]`, as SkyRL's own datasets give them. Optional: pip install skyrl-gym (extra `gym`).

`openenv`: OpenEnv environments (`reset(seed, episode_id, **kw) -> Observation`, `step(Action) ->
Observation` with `done` and `reward`), in this process ('module:Class') or served at a URL (OpenEnv's
HTTP/WebSocket server, through its GenericEnvClient). The model's reply fills one field of the action;
one field of the observation (or all of them) is the next user message. Optional: pip install openenv
(extra `openenv`)."""
from __future__ import annotations

import functools
import json
import typing
from typing import Any, Literal

from upslope.agents.env import Environment, Message, StepResult
from upslope.errors import ConfigError, did_you_mean
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
        hint = did_you_mean(env, skyrl_gym.registry)
        raise ConfigError(f"agent.env.options.env: skyrl_gym has no environment '{env}'{hint}; registered: "
                          f"{', '.join(sorted(skyrl_gym.registry))} (or give 'module:Class')")
    return lambda **kw: skyrl_gym.make(env, **kw)


class GymTextEnv(Environment):
    """The one adapter: `begin` gives the first messages, `advance` answers a model turn with
    (messages, reward, done); the step's reward is the part `reward`, `done` ends the trajectory."""

    reward_names = ("reward",)

    def begin(self, example: Any) -> list[Message]:
        """The environment made for this trajectory and its first messages."""
        raise NotImplementedError

    def advance(self, model_turn: str) -> tuple[list[Message], float, bool]:
        """The environment's answer to one model turn: its messages, the step's reward, whether it is done."""
        raise NotImplementedError

    def reset(self, example: Any) -> list[Message]:
        self.example = example
        return self.begin(example)

    def step(self, history: list[Message], model_turn: str) -> StepResult:
        messages, reward, done = self.advance(model_turn)
        return StepResult([dict(m) for m in messages], done=done, reward_parts={"reward": float(reward or 0.0)})


@ENVIRONMENTS.register("skyrl_gym")
class SkyRLGym(GymTextEnv):
    """A SkyRL-gym text environment: its init gives the first messages, its step answers each model turn with observations, a reward and done.

    env: the environment's id in skyrl_gym's registry (gsm8k, gsm8k_multi_turn, aime, ...) or 'module:Class' / 'file.py:Class'
    env_config: the environment's env_config (SkyRL's per-environment settings)
    extras: entries added to its extras (besides reward_spec.ground_truth, the example's answer, and extra_info, its fields)
    """

    def __init__(self, *, env: str = "gsm8k", env_config: dict[str, Any] | None = None,
                 extras: dict[str, Any] | None = None):
        self.make = skyrl_factory(env)
        self.name = env
        self.env_config, self.extras = dict(env_config or {}), dict(extras or {})
        self.env: Any = None

    def begin(self, example: Any) -> list[Message]:
        from omegaconf import OmegaConf  # SkyRL's environments read their env_config as an OmegaConf config

        extras = {"reward_spec": {"ground_truth": str(example.answer)}, "extra_info": dict(example.meta),
                  **self.extras}
        self.env = self.make(env_config=OmegaConf.create(self.env_config), extras=extras)
        messages, _ = self.env.init(example.messages())
        return list(messages)

    def advance(self, model_turn: str) -> tuple[list[Message], float, bool]:
        out = self.env.step(model_turn)
        return list(out.get("observations") or []), out["reward"], bool(out["done"])

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


def _openenv() -> None:
    """Check that OpenEnv is installed, or one ConfigError line saying how to install it."""
    import importlib

    try:
        importlib.import_module("openenv.core")
    except ModuleNotFoundError as exc:
        raise ConfigError(f"agent.env=openenv needs the openenv package ({exc.name} is missing): pip install openenv "
                          "(or upslope[openenv])") from None


@functools.lru_cache(maxsize=None)
def _openenv_classes(env: str, action: str) -> tuple[Any, Any]:
    """The Environment class `env` names and its Action class (`action`, or the type its step() annotates);
    loaded once per run, so every trajectory's environment shares them."""
    from upslope.rewards.user import load_user_function

    env_cls = load_user_function(env, "agent.env.options.env")
    if action:
        return env_cls, load_user_function(action, "agent.env.options.action")
    try:
        hinted = typing.get_type_hints(env_cls.step).get("action")
    except Exception:  # annotations that do not resolve: the action class has to be named
        hinted = None
    if not isinstance(hinted, type) or not hasattr(hinted, "model_fields"):
        raise ConfigError(f"agent.env.options.action: {env}'s step() does not annotate its action with an Action "
                          f"class; name it ('module:Class')")
    return env_cls, hinted


@ENVIRONMENTS.register("openenv")
class OpenEnv(GymTextEnv):
    """An OpenEnv environment, in this process or at a server's URL: the reply is the action, the observation the next message, its reward and done end the step.

    env: the Environment subclass as 'module:Class' or 'file.py:Class' (one instance per trajectory)
    base_url: instead of env, a running OpenEnv server (e.g. http://localhost:8000), one session per trajectory
    env_args: keyword arguments of the environment's constructor
    action: the Action class as 'module:Class' (default: the type the environment's step() annotates; a server takes a dict)
    action_field: the action's field that carries the model's reply
    observation_field: the observation's field shown to the model as the next user message ('': every field but done, reward and metadata, one 'name: value' line each)
    first_message: the first user message: the example's prompt, or the observation reset() returns
    task_kwarg: reset() gets the example (prompt, answer and its fields) as this keyword argument ('': not passed)
    seed: the seed reset() gets (None: not passed)
    """

    def __init__(self, *, env: str = "", base_url: str = "", env_args: dict[str, Any] | None = None, action: str = "",
                 action_field: str = "message", observation_field: str = "",
                 first_message: Literal["example", "observation"] = "example", task_kwarg: str = "task",
                 seed: int | None = None):
        if bool(env) == bool(base_url):
            raise ConfigError("agent.env=openenv: give the environment as options.env ('module:Class' or "
                              "'file.py:Class') or options.base_url (a running OpenEnv server), one of them")
        _openenv()
        self.classes = _openenv_classes(env, action) if env else None
        self.base_url, self.env_args = base_url, dict(env_args or {})
        self.action_field, self.observation_field = action_field, observation_field
        self.first_message, self.task_kwarg, self.seed = first_message, task_kwarg, seed
        self.env: Any = None

    def _text(self, observation: Any) -> str:
        fields = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation or {})
        if self.observation_field:
            if self.observation_field not in fields:
                raise ConfigError(f"agent.env.options.observation_field: the observation has no field "
                                  f"'{self.observation_field}'; its fields: {', '.join(fields)}")
            value = fields[self.observation_field]
            return value if isinstance(value, str) else json.dumps(value)
        return "\n".join(f"{k}: {v}" for k, v in fields.items() if k not in ("done", "reward", "metadata"))

    def begin(self, example: Any) -> list[Message]:
        kwargs: dict[str, Any] = {"episode_id": str(example.id) if example.id is not None else None}
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if self.task_kwarg:
            kwargs[self.task_kwarg] = {"prompt": example.prompt, "answer": example.answer, **example.meta}
        if self.classes is not None:
            self.env = self.classes[0](**self.env_args)
            observation = self.env.reset(**kwargs)
        else:
            from openenv.core.generic_client import GenericEnvClient

            self.env = GenericEnvClient(base_url=self.base_url).sync()
            self.env.connect()
            observation = self.env.reset(**kwargs).observation
        if self.first_message == "observation":
            return [{"role": "user", "content": self._text(observation)}]
        return example.messages()

    def advance(self, model_turn: str) -> tuple[list[Message], float, bool]:
        if self.classes is not None:
            obs = self.env.step(self.classes[1](**{self.action_field: model_turn}))
            reward, done = obs.reward, obs.done
        else:
            result = self.env.step({self.action_field: model_turn})
            obs, reward, done = result.observation, result.reward, result.done
        return ([] if done else [{"role": "user", "content": self._text(obs)}]), float(reward or 0.0), bool(done)

    def close(self) -> None:
        if self.env is not None and hasattr(self.env, "close"):
            self.env.close()
