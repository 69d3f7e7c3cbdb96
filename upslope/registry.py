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
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from upslope.config_base import bool_problem
from upslope.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Entry(Generic[F]):
    name: str
    fn: F
    doc: str
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> str:
        """The module that registered the plugin (where a user finds its code)."""
        return getattr(self.fn, "__module__", "?")

    def options(self) -> dict[str, inspect.Parameter]:
        """Keyword-only parameters of the plugin: its configurable options."""
        try:  # evaluate string annotations (`from __future__ import annotations`) so bind can check types
            sig = inspect.signature(self.fn, eval_str=True)
        except Exception:  # an annotation that cannot be evaluated: that option's type goes unchecked
            sig = inspect.signature(self.fn)
        return {n: p for n, p in sig.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def summary(self) -> str:
        """The docstring's first paragraph on one line (read now: a factory may set __doc__ after registering)."""
        head, _, _ = (inspect.getdoc(self.fn) or "").partition("\n\n")
        return " ".join(head.split())

    def option_help(self) -> dict[str, str]:
        """Help of each option from `name: help` lines after the docstring's first paragraph (the convention)."""
        body = (inspect.getdoc(self.fn) or "").partition("\n\n")[2].split("\n")
        names = self.options()
        found = (_OPTION_LINE.match(line) for line in body)
        return {m["name"]: m["help"].strip() for m in found if m and m["name"] in names}


_OPTION_LINE = re.compile(r"^\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*):\s+(?P<help>\S.*)$")


def _same_definition(a: Any, b: Any) -> bool:
    """The same source definition imported twice (a file loaded by path and as a module, say)."""
    try:
        return a.__qualname__ == b.__qualname__ and inspect.getsourcefile(a) == inspect.getsourcefile(b) is not None
    except (AttributeError, TypeError):
        return False


class DuplicateNameError(ConfigError, ValueError):
    """Two plugins claim one name in one registry (a user module reusing a built-in name, say)."""


REGISTRIES: dict[str, "Registry[Any]"] = {}


class Registry(Generic[F]):
    """A named table of plugins for one extension point."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}
        REGISTRIES.setdefault(kind, self)

    def register(self, name: str, **attrs: Any) -> Callable[[F], F]:
        """Decorator: `@ADVANTAGES.register("grpo")`. `attrs` are free-form flags (e.g. batched=True)."""

        def deco(fn: F) -> F:
            old = self._entries.get(name)
            if old is not None and old.fn is not fn:
                if _same_definition(old.fn, fn):  # the first import's entry stays
                    return fn
                raise DuplicateNameError(f"{self.kind} '{name}' is registered twice (by {old.module} and by "
                                         f"{getattr(fn, '__module__', '?')}); pick another name")
            doc = (inspect.getdoc(fn) or "").split("\n")[0]
            self._entries[name] = Entry(name, fn, doc, dict(attrs))
            return fn

        return deco

    def names(self) -> list[str]:
        """Names registered so far (call `load_builtins()` first for the complete list)."""
        return sorted(self._entries)

    def entries(self) -> list[Entry[F]]:
        """Every entry, built-ins included, sorted by name."""
        load_builtins()
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str, where: str | None = None) -> Entry[F]:
        """The entry called `name`; an unknown name is a ConfigError naming the closest entries."""
        if name not in self._entries:
            load_builtins()
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
                if (found := bool_problem(value, ann)) is not None:
                    raise ConfigError(f"{at}{key}: {found}")
                try:
                    options[key] = TypeAdapter(ann).validate_python(value)
                except ValidationError as exc:
                    msg = exc.errors()[0]["msg"]
                    raise ConfigError(f"{at}{key}: {msg} (got {value!r})") from None
        bound = functools.partial(entry.fn, **options)
        functools.update_wrapper(bound, entry.fn)
        return bound


_BUILTINS_LOADED = False
# Imported by name when a registry is first asked for a plugin it lacks. They register into
# the registries, so they import this module; none may import upslope.config at load time
# (config consults the registries: tests/test_import_graph.py checks both).
BUILTIN_MODULES = ("upslope.algos", "upslope.rewards", "upslope.data.tasks", "upslope.data.samplers",
                   "upslope.rollout.hf", "upslope.rollout.paged", "upslope.rollout.vllm", "upslope.rollout.shaping", "upslope.train.stages",
                   "upslope.agents")
BUILTIN_MODULES += ("upslope.algos.credit", "upslope.algos.confidence", "upslope.algos.credit_losses",
                    "upslope.algos.credit_critic", "upslope.algos.credit_salience")  # token credit
BUILTIN_MODULES += ("upslope.algos.tree", "upslope.rollout.tree", "upslope.data.decompose")  # trees, decomposition
BUILTIN_MODULES += ("upslope.algos.weight_search",)  # consolidation of weight perturbations (upslope randopt)
BUILTIN_MODULES += ("upslope.logs.trackers",)  # experiment trackers (log.trackers)
BUILTIN_MODULES += ("upslope.rollout.openai_agent", "upslope.rollout.unlocked",  # agent programs, turns not in lockstep
                    "upslope.agents.gym_envs", "upslope.agents.verifiers_env")  # SkyRL-gym, verifiers environments


def load_builtins() -> None:
    """Import the modules that register the built-in plugins (once, lazily)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    import importlib

    for mod in BUILTIN_MODULES:
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
ENVIRONMENTS: Registry = Registry("environment")
TOOLS: Registry = Registry("tool")
TOOL_FORMATS: Registry = Registry("tool_format")
REPLAY: Registry = Registry("replay")
CONSOLIDATORS: Registry = Registry("consolidate")
TRACKERS: Registry = Registry("tracker")
