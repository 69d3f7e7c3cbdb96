"""Environments of the `verifiers` package (prime-rl's format: `load_environment(...)` returns an
environment with its dataset and rubric) as an upslope task and an agent program.

`data.task=verifiers` (options `env`, `args`) gives the environment's dataset (train) and eval
dataset (test) as examples. The program `upslope.agents.verifiers_env:program`, run by
`rollout.kind=openai_agent`, runs the environment's own rollout (single-turn, or multi-turn with its
`env_response`) against the policy's OpenAI-compatible endpoint and returns its rubric's scores, so the
environment's code drives the conversation and upslope records the calls token-exact:

    data: {task: verifiers, options: {env: my_env.py, args: {...}}}
    rollout: {kind: openai_agent, options: {agent: "upslope.agents.verifiers_env:program"}}
    reward: [{name: env}]

Written against the classic verifiers API (0.1.x: vf.SingleTurnEnv, vf.MultiTurnEnv, vf.Rubric)."""
from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from upslope.data.types import Example
from upslope.errors import ConfigError, DataError
from upslope.registry import TASKS


def _verifiers() -> Any:
    try:
        import verifiers as vf
    except ModuleNotFoundError:
        raise ConfigError("data.task=verifiers needs the verifiers package (0.1.x): pip install 'verifiers<0.2'") \
            from None
    return vf


@functools.lru_cache(maxsize=8)
def load_env(env: str, args_json: str) -> Any:
    """The environment `env` names (an installed environment module, or a .py file defining load_environment),
    loaded once per process with `args`."""
    vf = _verifiers()
    args = json.loads(args_json)
    if env.endswith(".py"):
        path = Path(env).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"data.options.env: file {path} not found")
        name = f"upslope_verifiers_env_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        if not hasattr(module, "load_environment"):
            raise ConfigError(f"data.options.env: {path} defines no load_environment(...)")
        return module.load_environment(**args)
    try:
        return vf.load_environment(env, **args)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"data.options.env: no verifiers environment '{env}' is installed ({exc})") from None


@TASKS.register("verifiers", reward="env", splits=("train", "test"))
def verifiers_task(*, split: str = "train", env: str = "", args: dict[str, Any] | None = None,
                   limit: int | None = None) -> list[Example]:
    """A verifiers environment's dataset (train) or eval dataset (test); its rubric scores through rollout.kind=openai_agent.

    split: "train" (the environment's dataset) or "test" (its eval dataset, or the dataset when it has none)
    env: an installed verifiers environment's id, or a .py file that defines load_environment(...)
    args: keyword arguments of load_environment
    limit: at most this many rows (None: all)
    """
    if not env:
        raise ConfigError("data.task=verifiers: name the environment with data.options.env (an id or a .py file)")
    if split not in ("train", "test"):
        raise DataError(f"data.split={split!r}: task 'verifiers' has only the splits train, test")
    args_json = json.dumps(args or {}, sort_keys=True)
    vf_env = load_env(env, args_json)
    data = vf_env.get_dataset() if split == "train" else vf_env.get_eval_dataset()
    rows = list(data) if limit is None else list(data.select(range(min(limit, len(data)))))
    out = []
    for i, row in enumerate(rows):
        row = {k: v for k, v in row.items()}
        out.append(Example(prompt=row["prompt"], answer=row.get("answer", ""),
                           meta={"verifiers": {"env": env, "args": json.loads(args_json), "row": row}},
                           id=f"vf-{split}-{row.get('example_id', i)}"))
    return out


def program(base_url: str, row: dict[str, Any]) -> dict[str, float]:
    """The agent program of a verifiers task row: the environment's own rollout against `base_url`, scored by its
    rubric. One reward part, `reward`: the rubric's weighted sum, the environment's reward as verifiers defines it
    (its metrics, such as num_turns or a function of weight 0, are not rewards and are not added to it)."""
    vf = _verifiers()
    spec = row.get("verifiers")
    if not isinstance(spec, dict):
        raise ValueError("upslope.agents.verifiers_env:program runs rows of data.task=verifiers")
    vf_env = load_env(spec["env"], json.dumps(spec["args"], sort_keys=True))
    data = spec["row"]
    inp = {"prompt": data["prompt"], "example_id": data.get("example_id", 0), "answer": data.get("answer", ""),
           "info": data.get("info") or {}}
    client = vf.ClientConfig(api_base_url=base_url, api_key_var="UPSLOPE_VERIFIERS_KEY", max_retries=0)
    import os

    os.environ.setdefault("UPSLOPE_VERIFIERS_KEY", "unused")
    out = asyncio.run(vf_env.run_rollout(inp, client, "policy", {}))
    if out.get("error"):
        raise RuntimeError(f"the verifiers rollout failed: {out['error']}")
    return {"reward": float(out["reward"])}
