"""The building blocks of the config tree: a strict section, an option with its one-line help
(and, for a plugin name, its registry), and a plugin reference with options."""
from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

INT64 = 2**63  # integers a count or a size may take: what torch and numpy hold
SEED_RANGE = {"ge": 0, "lt": 2**32}  # a seed option's bounds: what every generator seeded from it takes


def number_problem(value: Any, path: str = "") -> str | None:
    """What is wrong with a number inside an option's value (NaN or inf, or an integer over 64 bits),
    searched through lists and mappings (`path` names the item inside, e.g. `count[1]`); None when
    every number is usable. YAML reads `.inf`, `.nan` and `1e999` as floats, and none is a usable
    count, rate or weight."""
    at = f" at {path} (got {value!r})" if path else ""
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number{at}"
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"expected an integer of at most 18 digits (below 2**63){at}"
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for sub, item in items if (found := number_problem(item, sub))), None)


class Section(BaseModel):
    """A strict config section: unknown keys, and numbers no option can use (NaN, inf, integers over
    64 bits, checked here once for every option and plugin-options mapping), are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="after")
    @classmethod
    def _usable_numbers(cls, value: Any) -> Any:
        found = number_problem(value)
        if found:
            raise ValueError(found)
        return value


def opt(default: Any, help: str, registry: str | None = None, **kw: Any) -> Any:
    """A config option: its default, one-line help and, for a plugin name, the registry kind it names."""
    extra = {"registry": registry} if registry else None
    return Field(default, description=help, json_schema_extra=extra, **kw)


def opt_factory(factory: Any, help: str) -> Any:
    return Field(default_factory=factory, description=help)


class Plugin(Section):
    """A registry entry by name plus its options (checked against the plugin's signature)."""

    name: str = opt(..., "registry name of the plugin")
    options: dict[str, Any] = opt({}, "keyword options passed to the plugin")


class RewardSpec(Plugin):
    weight: float = opt(1.0, "weight of this component in the combined reward")
    as_name: str | None = opt(None, "component name in logs (default: the reward's name)")
