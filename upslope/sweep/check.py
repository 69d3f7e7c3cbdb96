"""The sweep's checks before any trial runs: every value of the space, every drawn configuration and
the metric's name against the config (and the plugins' options), each failure one ConfigError line."""
from __future__ import annotations

from typing import Any

from upslope.config import Config, load_config
from upslope.config_base import Plugin, Section
from upslope.errors import ConfigError, did_you_mean
from upslope.sweep.spec import EVAL_KEYS, Range, SweepSpec, yaml_value


def base_overrides(spec: SweepSpec) -> list[str]:
    """What every trial of the sweep is given before its own point: the user's overrides, the proxy model."""
    return [*spec.overrides, *([f"model.name={spec.proxy}"] if spec.proxy else [])]


def point_overrides(point: dict[str, Any]) -> list[str]:
    return [f"{k}={yaml_value(v)}" for k, v in point.items()]


def trial_config(spec: SweepSpec, point: dict[str, Any]) -> Config:
    """The validated config of a trial at `point` (plugin options checked too)."""
    cfg = load_config(spec.recipe, [*base_overrides(spec), *point_overrides(point)])
    check_plugin_options(cfg)
    return cfg


def check_plugin_options(section: Section, prefix: str = "") -> None:
    """Every plugin named in the config takes the options it is given (a typo inside `options` is not
    caught by the config's own validation, only when the trainer binds the plugin)."""
    from upslope.registry import REGISTRIES, ROLLOUTS, TASKS

    for key, field in type(section).model_fields.items():
        value = getattr(section, key)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = extra.get("registry")
        items = value if isinstance(value, list) else [value]
        if kind and kind != "reward" and all(isinstance(v, Plugin) or v is None for v in items):
            for i, item in enumerate(items):
                if item is not None:
                    where = f"{prefix}{key}" + (f"[{i}]" if isinstance(value, list) else "") + ".options"
                    REGISTRIES[str(kind)].bind(item.name, item.options, where=where)
        elif isinstance(value, Section) and not isinstance(value, Plugin):
            check_plugin_options(value, f"{prefix}{key}.")
    if isinstance(section, Config):
        if section.data.path is None:
            TASKS.bind(section.data.task, section.data.options, where="data.options")
        if not ROLLOUTS.get(section.rollout.kind, "rollout.kind").traits.setup:
            ROLLOUTS.bind(section.rollout.kind, section.rollout.options, where="rollout.options")


def lookup(cfg: Config, key: str) -> Any:
    """The resolved value of a dotted key (through sections and option mappings)."""
    node: Any = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node.model_dump(mode="json") if isinstance(node, Section) else node


def check_space(spec: SweepSpec) -> Config:
    """Each value (a range: both ends) on top of the recipe and overrides; returns the config of a trial
    without a point (its train.steps is the default single rung)."""
    try:
        base = trial_config(spec, {})
    except ConfigError as exc:
        raise ConfigError(f"upslope sweep: the recipe with its overrides: {exc}") from None
    for key, dim in spec.space.items():
        for value in (list(dim.bounds) if isinstance(dim, Range) else dim):
            try:
                trial_config(spec, {key: value})
            except ConfigError as exc:
                raise ConfigError(f"upslope sweep --space {key}={yaml_value(value)}: {exc}") from None
    check_metric(spec.metric, base)
    return base


def check_metric(metric: str, cfg: Config) -> None:
    """An evaluation metric names a key the evaluation logs (eval/accuracy, eval/pass@k with k in eval.k,
    ...); other metrics are checked against the first trial's metrics.jsonl."""
    if not metric.startswith("eval/") or "/" in metric.removeprefix("eval/"):
        return  # a training metric, or an evaluation metric of a rollout plugin's metadata
    ks = cfg.eval.k
    known = [*EVAL_KEYS, *[f"pass@{k}" for k in ks], *[f"maj@{k}" for k in ks if k > 1]]
    name = metric.removeprefix("eval/")
    if name in known:
        return
    hint = did_you_mean(name, known, shown=lambda near: f"eval/{near}")
    more = f"; pass@k and maj@k need k in eval.k={ks}" if name.startswith(("pass@", "maj@")) else ""
    raise ConfigError(f"upslope sweep --metric {metric}: the evaluation does not log it{hint}{more}; "
                      f"it logs eval/{', eval/'.join(known)}")


def metric_missing(metric: str, logged: list[str], trial: str, step: int, flag: str = "metric") -> ConfigError:
    """The error for a metric (of the setting `flag`) a finished trial did not log."""
    hint = did_you_mean(metric, logged)
    return ConfigError(f"upslope sweep --{flag.replace('_', '-')} {metric}: trial {trial} logged no such metric up to step {step}"
                       f"{hint}; it logged {', '.join(sorted(logged)) or 'nothing'}")
