"""Registries: every extension point is a name -> plugin table filled by a decorator.

Plugins are plain functions (or small classes). Their keyword-only parameters are their
options: a config names a plugin and gives options, and `Registry.bind` checks the option
names and types against the signature, so a typo in a recipe is an error, not a silent
default. What the rest of the framework needs to know about a plugin (does an advantage
compare within groups? does a reward need the whole round?) are its traits: each registry
declares them as a dataclass (`AdvantageTraits`, ...), `register(name, **traits)` checks the
names and types, and callers read `entry.traits.grouped`, never a string.
"""
from __future__ import annotations

import functools
import inspect
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from upslope.config_base import bool_problem
from upslope.errors import ConfigError, did_you_mean

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Traits:
    """A registry whose plugins declare no traits."""

    def check(self, name: str, fn: Callable[..., Any]) -> None:
        """Raise TypeError when the plugin cannot have these traits (e.g. a trait that needs an option)."""


@dataclass(frozen=True)
class AdvantageTraits(Traits):
    grouped: bool = False  # compares completions within a group: needs rollout.n >= 2
    critic: bool = False  # needs PPO's value model (batch.values) and returns (advantages, returns)
    token_rewards: bool = False  # reads rewards placed on tokens (batch.token_rewards)
    whole_batch: bool = False  # uses statistics of the whole batch: the update cannot stream groups
    salience: str | None = None  # takes the policy's token salience from this source; has option answer_tokens
    # each rollout's features from this source: hidden_mean [N, D], hidden_states [N, L, D], answer_gain [N, 1],
    # influence [N, 1] (whole batch)
    features: str | None = None

    def check(self, name: str, fn: Callable[..., Any]) -> None:
        if self.salience and "answer_tokens" not in inspect.signature(fn).parameters:
            raise TypeError(f"advantage '{name}': salience={self.salience!r} needs an option answer_tokens "
                            f"(the answer region the salience is measured against)")


@dataclass(frozen=True)
class PolicyLossTraits(Traits):
    zero_at_zero_advantage: bool = False  # exactly 0, with 0 gradient, on a row whose advantage is 0
    token_stats: bool = False  # takes this forward's entropy (and with top_k its top-k log-probs)
    top_k: int = 0  # how many of the policy's most likely tokens it reads


@dataclass(frozen=True)
class RewardTraits(Traits):
    batched: bool = False  # scores every sample of a round in one call
    context: bool = False  # takes the run's RewardContext (tokenizer, engine)
    whole_batch: bool = False  # uses statistics of the whole round: rounds cannot arrive in pieces
    answer: Callable[..., Any] | None = None  # (answer, options) -> raises ValueError for an answer it cannot use
    places_tokens: Callable[..., Any] | None = None  # (options) -> does it put rewards on tokens?
    logprobs: bool = False  # takes each completion's token ids and the sampler's log-probs (token_ids=, logprobs=)

    def check(self, name: str, fn: Callable[..., Any]) -> None:
        if self.logprobs and not self.batched:
            raise TypeError(f"reward '{name}': logprobs=True needs batched=True (it takes lists of token ids and "
                            f"log-probs)")


@dataclass(frozen=True)
class CombinerTraits(Traits):
    linear: bool = False  # a weighted sum of the components (token rewards are its weighted parts)
    whole_batch: bool = False  # uses statistics of the whole round


@dataclass(frozen=True)
class FilterTraits(Traits):
    whole_batch: bool = False  # compares across the whole round


@dataclass(frozen=True)
class SamplerTraits(Traits):
    examples: bool = False  # takes the training examples
    extend: Callable[..., Any] | None = None  # (examples, data, **options) -> prompts it adds to the task's
    features: str | None = None  # given each training prompt's feature vector [P, D] from this source at set-up
    confidence: bool = False  # its update is also given each sample's confidence (update(..., confidence=))


@dataclass(frozen=True)
class TaskTraits(Traits):
    reward: str | None = None  # the reward it is scored with by default
    reward_options: dict[str, Any] = field(default_factory=dict)  # that reward's options
    max_new_tokens: int | None = None  # its default rollout.max_new_tokens
    splits: tuple[str, ...] | None = None  # the splits it has (None: any the source has)


@dataclass(frozen=True)
class RolloutTraits(Traits):
    train_only: bool = False  # a training-time shaping of the samples: evaluation samples plainly instead
    setup: Callable[..., Any] | None = None  # (cfg, tokenizer, evaluation) -> the rollout, built once per run
    routed_experts: bool = False  # its batches carry the engine's routed experts (algo.routing_replay)


@dataclass(frozen=True)
class EngineTraits(Traits):
    requires: str | None = None  # the module it needs installed
    install: str | None = None  # how to install it
    auto_rank: int | None = None  # engine.name=auto picks the lowest rank that is installed (None: never)
    copies_policy: bool = False  # generates with a private copy of the policy's weights
    model_check: Callable[..., Any] | None = None  # (model path) -> why it cannot run that model, or None
    routed_experts: bool = False  # returns a MoE model's routed experts (SamplingParams.routed_experts)


@dataclass(frozen=True)
class TrackerTraits(Traits):
    package: str | None = None  # the package it needs installed


@dataclass(frozen=True)
class PreferenceLossTraits(Traits):
    reference: bool = True  # needs the frozen reference's log-probs
    rewards: bool = False  # takes the pairs' scalar rewards (PairRewards) as a third argument


@dataclass
class Entry(Generic[F]):
    name: str
    fn: F
    doc: str
    traits: Any = field(default_factory=Traits)  # the registry's traits dataclass

    def shown_traits(self) -> dict[str, Any]:
        """The traits that differ from their default (what the plugin tables show)."""
        out = {}
        for f in fields(self.traits):
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            value = getattr(self.traits, f.name)
            if value != default:
                out[f.name] = value
        return out

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
    """A named table of plugins for one extension point, whose plugins declare `traits`."""

    def __init__(self, kind: str, traits: type[Traits] = Traits):
        self.kind = kind
        self.traits = traits
        self._entries: dict[str, Entry[F]] = {}
        REGISTRIES.setdefault(kind, self)

    def make_traits(self, name: str, given: dict[str, Any]) -> Traits:
        """The registry's traits dataclass from `register`'s keywords: an unknown name or a wrong type is an error."""
        known = {f.name: f for f in fields(self.traits)}
        for key in given:
            if key not in known:
                hint = did_you_mean(key, known)
                raise TypeError(f"{self.kind} '{name}': unknown trait '{key}'{hint}; "
                                f"known: {', '.join(known) or 'none'}")
        try:
            return TypeAdapter(self.traits).validate_python(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise TypeError(f"{self.kind} '{name}': trait {'.'.join(map(str, err['loc']))}: {err['msg']}") from None

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator: `@ADVANTAGES.register("grpo", grouped=True)`; the keywords are the plugin's traits
        (the fields of this registry's traits dataclass)."""
        checked = self.make_traits(name, traits)

        def deco(fn: F) -> F:
            old = self._entries.get(name)
            if old is not None and old.fn is not fn:
                if _same_definition(old.fn, fn):  # the first import's entry stays
                    return fn
                raise DuplicateNameError(f"{self.kind} '{name}' is registered twice (by {old.module} and by "
                                         f"{getattr(fn, '__module__', '?')}); pick another name")
            checked.check(name, fn)
            doc = (inspect.getdoc(fn) or "").split("\n")[0]
            self._entries[name] = Entry(name, fn, doc, checked)
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
            hint = did_you_mean(name, self.names())
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
                hint = did_you_mean(key, known)
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
                   "upslope.rollout.hf", "upslope.rollout.paged", "upslope.rollout.vllm", "upslope.rollout.plugin",
                   "upslope.rollout.multi_turn", "upslope.rollout.shaping", "upslope.agents",
                   "upslope.algos.credit", "upslope.algos.confidence", "upslope.algos.credit_losses",  # token credit
                   "upslope.algos.credit_critic", "upslope.algos.credit_salience",
                   "upslope.algos.tree", "upslope.rollout.tree", "upslope.data.decompose",  # trees, decomposition
                   "upslope.rollout.branching",  # siblings from an edited prefix (E3RL's erasure, ReSum's summaries)
                   "upslope.algos.weight_search",  # consolidation of weight perturbations (upslope randopt)
                   "upslope.algos.geometry",  # advantages reading the rollouts' hidden-state features
                   "upslope.algos.infuser", "upslope.rollout.infuser",  # INFUSER: two roles, influence
                   "upslope.data.bmc",  # a sampler over a task tree of the prompts' hidden states
                   "upslope.data.saerl",  # a sampler over a sparse autoencoder of the prompts' hidden states
                   "upslope.algos.triage",  # routing prompts by the attention pivots of their rollouts
                   "upslope.algos.direction", "upslope.algos.prefix_utility",  # DiRL; PUM's prefix utility head
                   "upslope.algos.state_value", "upslope.rewards.milestones",  # Hista, Numca: other rollouts' returns
                   "upslope.logs.trackers",  # experiment trackers (log.trackers)
                   "upslope.rollout.openai_agent", "upslope.rollout.unlocked",  # agent programs, turns not in lockstep
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


ADVANTAGES: Registry = Registry("advantage", AdvantageTraits)
POLICY_LOSSES: Registry = Registry("policy_loss", PolicyLossTraits)
KL_ESTIMATORS: Registry = Registry("kl")
REWARDS: Registry = Registry("reward", RewardTraits)
REWARD_COMBINERS: Registry = Registry("reward_combiner", CombinerTraits)
FILTERS: Registry = Registry("filter", FilterTraits)
SAMPLERS: Registry = Registry("sampler", SamplerTraits)
TASKS: Registry = Registry("task", TaskTraits)
ROLLOUTS: Registry = Registry("rollout", RolloutTraits)
ENGINES: Registry = Registry("engine", EngineTraits)
DISTILL_LOSSES: Registry = Registry("distill_loss")
PREFERENCE_LOSSES: Registry = Registry("preference_loss", PreferenceLossTraits)
ENVIRONMENTS: Registry = Registry("environment")
TOOLS: Registry = Registry("tool")
TOOL_FORMATS: Registry = Registry("tool_format")
REPLAY: Registry = Registry("replay")
LOSS_TERMS: Registry = Registry("loss_term")
ACCEPTS: Registry = Registry("accept")
CONSOLIDATORS: Registry = Registry("consolidate")
TRACKERS: Registry = Registry("tracker", TrackerTraits)
