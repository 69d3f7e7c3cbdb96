"""Checks of a config beyond its fields' types: options in their old places, plugin names against their
registries, and options that cannot act in the configuration they are in (each a one-line ConfigError)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from upslope.config_base import Plugin, Section
from upslope.errors import ConfigError, did_you_mean


# options that became plugins: old spelling -> where it lives now
MOVED = {
    "discrepancy": "DCMDP is a loss term: algo.terms: [{name: dcmdp, options: {init: 0.0, lr: 1.0, tolerance: 0.001}}]",
    "accept": "MIPU is an update check: algo.accept: {name: mipu, options: {gap_coef: 1.0, min_gain: 0.0}}",
}


def check_moved(raw: dict[str, Any], source: str) -> None:
    """An option in its old place is one ConfigError line naming the new one."""
    algo = raw.get("algo") if isinstance(raw.get("algo"), dict) else {}
    if "discrepancy" in algo:
        raise ConfigError(f"{source}: algo.discrepancy moved: {MOVED['discrepancy']}")
    accept = algo.get("accept")
    if isinstance(accept, dict) and "name" not in accept and {"gap_coef", "min_gain"} & set(accept):
        raise ConfigError(f"{source}: algo.accept names a plugin now: {MOVED['accept']}")


def check_idle_options(cfg: Any, source: str = "config") -> None:
    """An option that cannot act in this configuration is a ConfigError, not a silent no-op."""
    from upslope.registry import ADVANTAGES, ROLLOUTS

    a = cfg.algo
    if a.correction is not None and a.old_policy == "sampler":
        raise ConfigError(f"{source}: algo.correction has no effect with algo.old_policy=sampler (the ratio is already "
                          f"taken against the sampler's log-probs, so every weight is 1); drop one of them")
    if a.kl_target is not None and not a.kl_coef:
        raise ConfigError(f"{source}: algo.kl_target needs algo.kl_coef > 0 (the adaptive coefficient starts there; "
                          f"with 0 no KL is computed at all)")
    if a.routing_replay and not ROLLOUTS.get(cfg.rollout.kind, "rollout.kind").traits.routed_experts:
        kinds = sorted(e.name for e in ROLLOUTS.entries() if e.traits.routed_experts)
        raise ConfigError(f"{source}: algo.routing_replay: rollout.kind={cfg.rollout.kind} does not keep the experts "
                          f"the engine routed each token to; use {' or '.join(kinds)}")
    if cfg.critic != type(cfg.critic)() and not ADVANTAGES.get(a.advantage.name).traits.critic:
        raise ConfigError(f"{source}: critic options are set but algo.advantage '{a.advantage.name}' uses no critic "
                          f"(gae and sr_ppo do); drop them or pick a critic estimator")


EXTRA_NAMES = {"engine": ("auto",)}  # accepted besides the registered names


def check_plugin_names(section: BaseModel, source: str = "config", prefix: str = "") -> None:
    """Every option that names a plugin names a registered one (a ConfigError line listing the known names)."""
    from upslope.registry import REGISTRIES, load_builtins

    load_builtins()
    for key, field in type(section).model_fields.items():
        value = getattr(section, key)
        kind = (field.json_schema_extra or {}).get("registry") if isinstance(field.json_schema_extra, dict) else None
        if kind is None:
            if isinstance(value, Section) and not isinstance(value, Plugin):
                check_plugin_names(value, source, f"{prefix}{key}.")
            continue
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if item is None:  # an optional plugin left off
                continue
            name = item.name if isinstance(item, Plugin) else item
            where = f"{prefix}{key}" + (f"[{i}]" if isinstance(value, list) else "")
            where += ".name" if isinstance(item, Plugin) else ""
            known = REGISTRIES[str(kind)].names() + list(EXTRA_NAMES.get(str(kind), ()))
            if name in known or (kind == "reward" and ":" in name):  # reward: also a user `module:function`
                continue
            hint = did_you_mean(name, known)
            raise ConfigError(f"{source}: {where}: unknown {kind} '{name}'{hint}; known: {', '.join(sorted(known))}")
