"""Registries: every extension point is a name -> plugin table filled by a decorator.

Plugins are plain functions (or small classes). Their keyword-only parameters are their
options: a config names a plugin and gives options, and `Registry.bind` checks the option
names and types against the signature, so a typo in a recipe is an error, not a silent
default.
"""
from __future__ import annotations

import difflib
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from upslope.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Entry(Generic[F]):
    name: str
    fn: F
    doc: str
    attrs: dict[str, Any] = field(default_factory=dict)

    def options(self) -> dict[str, inspect.Parameter]:
        """Keyword-only parameters of the plugin: its configurable options."""
        try:  # evaluate string annotations (`from __future__ import annotations`) so bind can check types
            sig = inspect.signature(self.fn, eval_str=True)
        except Exception:  # an annotation that cannot be evaluated: that option's type goes unchecked
            sig = inspect.signature(self.fn)
        return {n: p for n, p in sig.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


class Registry(Generic[F]):
    """A named table of plugins for one extension point."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, **attrs: Any) -> Callable[[F], F]:
        """Decorator: `@ADVANTAGES.register("grpo")`. `attrs` are free-form flags (e.g. batched=True)."""

        def deco(fn: F) -> F:
            if name in self._entries and self._entries[name].fn is not fn:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            doc = (inspect.getdoc(fn) or "").split("\n")[0]
            self._entries[name] = Entry(name, fn, doc, dict(attrs))
            return fn

        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str, where: str | None = None) -> Entry[F]:
        """The entry called `name`; an unknown name is a ConfigError naming the closest entries."""
        if name not in self._entries:
            _load_builtin_plugins()
        if name not in self._entries:
            near = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            at = f"{where}: " if where else ""
            raise ConfigError(f"{at}unknown {self.kind} '{name}'{hint}; known: {', '.join(self.names())}")
        return self._entries[name]

    def bind(self, name: str, options: dict[str, Any] | None = None, where: str | None = None) -> Callable[..., Any]:
        """The plugin with its options checked and applied (a functools.partial)."""
        entry = self.get(name, where)
        options = dict(options or {})
        known = entry.options()
        at = f"{where}." if where else ""
        for key, value in list(options.items()):
            if key not in known:
                near = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                valid = ", ".join(known) or "none"
                raise ConfigError(f"{at}{key}: unknown option for {self.kind} '{name}'{hint}; valid: {valid}")
            ann = known[key].annotation
            if ann is not inspect.Parameter.empty and not isinstance(ann, str):
                try:
                    options[key] = TypeAdapter(ann).validate_python(value)
                except ValidationError as exc:
                    msg = exc.errors()[0]["msg"]
                    raise ConfigError(f"{at}{key}: {msg} (got {value!r})") from None
        bound = functools.partial(entry.fn, **options)
        functools.update_wrapper(bound, entry.fn)
        return bound


_BUILTINS_LOADED = False


def _load_builtin_plugins() -> None:
    """Import the modules that register the built-in plugins (once, lazily)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    import importlib

    for mod in ("upslope.algos", "upslope.rewards", "upslope.data.tasks", "upslope.data.samplers"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:  # a module not written yet in a partial install
            if exc.name != mod:
                raise


ADVANTAGES: Registry = Registry("advantage")
POLICY_LOSSES: Registry = Registry("policy_loss")
KL_ESTIMATORS: Registry = Registry("kl")
REWARDS: Registry = Registry("reward")
REWARD_COMBINERS: Registry = Registry("reward_combiner")
FILTERS: Registry = Registry("filter")
SAMPLERS: Registry = Registry("sampler")
TASKS: Registry = Registry("task")
ROLLOUTS: Registry = Registry("rollout")
ENGINES: Registry = Registry("engine")
DISTILL_LOSSES: Registry = Registry("distill_loss")
PREFERENCE_LOSSES: Registry = Registry("preference_loss")
