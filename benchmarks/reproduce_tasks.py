"""External tasks a reproduction can run on instead of upslope's own arithmetic, for benchmarks/reproduce.py
--task: each is a task recipe whose task, reward, reply length, evaluation size and chat template replace those
of both arms' recipes, so a method keeps its own mechanism (advantage, sampler, rollout kind, filters) and meets
a task written by others, with replies long enough to have segments."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# name -> the task recipe the overlay is read from (reasoning-gym generators where SmolLM2-135M learns in 20 steps,
# base pass rate 10-50% at n=8: docs/agents.md)
TASKS: dict[str, str] = {
    "chain_sum": "reasoning_gym_chain_sum",
    "basic_arithmetic": "reasoning_gym_basic_arithmetic",
}
OWN_TASK = "arith"  # the rows without --task: upslope's own arithmetic (headroom.yaml and its relatives)


def _recipe(name: str) -> dict[str, Any]:
    from upslope.config_files import read_recipe

    return read_recipe(ROOT / "recipes" / f"{name}.yaml")


def task_overrides(task: str) -> list[str]:
    """The `key=value` overrides that put an arm on `task`: its data source (task and options; the arm's sampler
    stays), its reward, reply length, evaluation size and chat template (the model's own where the task recipe
    sets none, so a prefill template of the arithmetic recipes does not carry over)."""
    if task not in TASKS:
        raise SystemExit(f"--task: expected one of {', '.join(sorted(TASKS))}, got {task!r}")
    r = _recipe(TASKS[task])
    data, model = r["data"], r.get("model", {})
    out = [f"data.task={data['task']}", f"data.options={json.dumps(data.get('options', {}))}",
           f"reward={json.dumps(r['reward'])}", f"rollout.max_new_tokens={r['rollout']['max_new_tokens']}",
           f"eval.limit={r['eval']['limit']}", f"model.chat_template={json.dumps(model.get('chat_template'))}"]
    if data.get("split") is not None:
        out.append(f"data.split={data['split']}")
    return out


def check_portable(method: str, recipe: str, baseline: str, task: str, command: str = "train") -> None:
    """Refuse, in one line naming the method, a claim whose arms cannot move to `task`: one not run by
    `upslope train`, whose recipes are not on the arith task scored by its own verifier (a reward section of
    several components, a shaped reward, an environment or another task is the mechanism or its setting, which
    the external task's data and verifier would replace), or whose sampler refuses the task's data at set-up
    (TD-Grokking decomposes the arith task's operands by rule)."""
    if command != "train":
        raise SystemExit(f"--task: {method} runs `upslope {command}`; only `upslope train` claims move to another task")
    for name in (recipe, baseline):
        raw = _recipe(name)
        if raw.get("data", {}).get("task") != OWN_TASK or raw.get("reward") or raw.get("agent"):
            raise SystemExit(f"--task: {method}'s recipe {name} is not the {OWN_TASK} task scored by its own verifier "
                             "(its reward, environment or task is part of the claim); it runs on its own task only")
        for where, field in example_fields(raw):
            raise SystemExit(f"--task: {method}'s recipe {name} sets {where}={field}, a field of the {OWN_TASK} task's "
                             "examples that another task's lack; it runs on its own task only")
        check_setup(method, name, task)


def check_setup(method: str, name: str, task: str) -> None:
    """Resolve recipe `name` on `task` and build the training prompts its sampler adds at set-up, as `upslope train`
    does before any work; its refusal, in one line naming the method."""
    from upslope.config import load_config
    from upslope.data.samplers import sampler_examples
    from upslope.errors import ConfigError

    try:
        sampler_examples(load_config(ROOT / "recipes" / f"{name}.yaml", task_overrides(task)).data, [])
    except ConfigError as exc:
        raise SystemExit(f"--task: {method}'s recipe {name} does not set up on {task} ({exc}); "
                         "it runs on its own task only") from None


def example_fields(raw: Any, where: str = "") -> list[tuple[str, str]]:
    """The options of a recipe that name a field of the task's examples (`*_key: FIELD`, e.g. a sampler's
    `cluster_key`), as (dotted option, field)."""
    if isinstance(raw, dict):
        found = []
        for key, value in raw.items():
            path = f"{where}.{key}" if where else str(key)
            if str(key).endswith("_key") and isinstance(value, str):
                found.append((path, value))
            else:
                found += example_fields(value, path)
        return found
    if isinstance(raw, list):
        return [f for i, item in enumerate(raw) for f in example_fields(item, f"{where}[{i}]")]
    return []
