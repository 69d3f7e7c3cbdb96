"""The building blocks of the config tree: a strict section, an option with its one-line help
(and, for a plugin name, its registry), and a plugin reference with options."""
from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

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


def admits_bool(annotation: Any) -> bool:
    """Does an option of this type take true/false? (pydantic's lax mode reads `true` as 1 for a
    count or a rate, so `train.steps=true` would quietly mean one step.)"""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(admits_bool(arg) for arg in typing.get_args(annotation))
    return False


def type_words(annotation: Any) -> str:
    """An option's type as a user reads it: `int or 'auto'`, `float`, `list`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_words(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_words(a) for a in args if a is not type(None))
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    return getattr(origin or annotation, "__name__", str(annotation))


def bool_problem(value: Any, annotation: Any) -> str | None:
    """The error for a true/false given to an option that is not a switch; None otherwise."""
    if isinstance(value, bool) and not admits_bool(annotation):
        return f"expected {type_words(annotation)}, not {str(value).lower()}"
    return None


class Section(BaseModel):
    """A strict config section: unknown keys, and numbers no option can use (NaN, inf, integers over
    64 bits, checked here once for every option and plugin-options mapping), are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        found = bool_problem(value, field.annotation) if field is not None else None
        if found:
            raise ValueError(found)
        return value

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
    style: Literal["auto", "upslope", "batched", "trl", "verl", "openrlhf"] = opt(
        "auto", "calling convention of a user function module:function (auto: detected from its signature): "
                "upslope fn(completion, answer, meta); batched fn(completions, answers, metas); trl "
                "fn(completions, **columns); verl compute_score(data_source, solution_str, ground_truth, "
                "extra_info); openrlhf reward_func(queries, prompts, labels)")
