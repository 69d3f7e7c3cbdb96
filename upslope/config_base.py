"""The building blocks of the config tree: a strict section, an option with its one-line help
(and, for a plugin name, its registry), and a plugin reference with options."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
