"""Rewards: the registry's built-in verifiers, user functions, and the scoring stage.

Signature of a reward: `fn(completion: str, answer, meta: dict, *, options) -> float` or a
dict of named float components. A reward registered with `batched=True` takes lists and
returns a list (e.g. the code reward, which runs a whole batch in a sandbox pool). A value may
be a PlacedReward (upslope.rewards.placement): parts of the reward at offsets in the completion,
which become token rewards. User functions may also be written in TRL's, verl's or OpenRLHF's
convention (upslope.rewards.styles), detected from their signature.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from upslope.errors import SetupError
from upslope.registry import REWARDS
from upslope.rewards import builtin  # noqa: F401  (registers integer, exact, format, math)
from upslope.rewards.context import RewardContext
from upslope.rewards.placement import PlacedReward
from upslope.rewards.styles import NOT_APPLICABLE, StyledReward, check_per_sample, detect_style, signature_text
from upslope.rewards.user import load_user_function

for _mod in ("upslope.rewards.length", "upslope.rewards.code", "upslope.rewards.reward_model",
             "upslope.rewards.judge", "upslope.rewards.process", "upslope.rewards.calibration",
             "upslope.rewards.arena", "upslope.rewards.diversity", "upslope.rewards.segments",
             "upslope.rewards.reference_judge", "upslope.rewards.perplexity", "upslope.rewards.self_reward",
             "upslope.rewards.sql", "upslope.rewards.optimization", "upslope.rewards.introspection",
             "upslope.rewards.reasoning_gym",
             "upslope.rewards.claims"):  # BALTO's verified claims
    try:
        __import__(_mod)
    except ModuleNotFoundError as _exc:  # optional plugins not present in a partial checkout
        if _exc.name != _mod:
            raise


if TYPE_CHECKING:  # rewards register into the registries that config consults: no config import at load
    from upslope.config import DataConfig, RewardSpec

_FAILED = object()  # marks a sample whose reward raised (already counted)


@dataclass
class RewardFn:
    name: str
    weight: float
    fn: Callable[..., Any]
    batched: bool = False
    places_tokens: bool = False  # it may return PlacedRewards (the registry trait `places_tokens` of its options)
    answer_check: Callable[[Any], Any] | None = None  # raises ValueError for a reference answer it cannot use
    check: Callable[[Sequence[Any]], None] | None = None  # checks a user function's convention against the examples
    token_ids: bool = False  # called with the completions' token ids too (`token_ids=`; TRL's completion_ids)
    logprobs: bool = False  # called with the token ids and the sampler's log-probs (`token_ids=`, `logprobs=`)
    note: str = ""  # how a user function is called, said once at setup


@dataclass
class RewardResult:
    """Scores of one batch: per-component lists, failure counts and first error per component, and
    the parts of each placed reward (component -> sample -> (character offset, value) parts)."""

    components: dict[str, list[float]]
    weights: dict[str, float]
    failures: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    placed: dict[str, dict[int, tuple[tuple[int, float], ...]]] = field(default_factory=dict)
    not_applicable: dict[str, int] = field(default_factory=dict)  # samples a reward returned None for (TRL)


def build_reward_fns(specs: Sequence[RewardSpec], data_cfg: DataConfig | None = None,
                     context: RewardContext | None = None) -> list[RewardFn]:
    """Bind the configured rewards (or the task's default reward when none is configured). A
    reward registered with `context=True` (reward_model, llm_judge, process) is given the run's
    RewardContext and called once on no samples, so that it loads, and checks what it needs, now."""
    from upslope.config import RewardSpec
    from upslope.data import task_default_reward

    if not specs:
        default = task_default_reward(data_cfg) if data_cfg is not None else None
        if default is None:
            from upslope.errors import ConfigError

            raise ConfigError("reward: no reward configured and the data source names none; "
                              "add e.g. reward: [{name: integer}] or name: mypkg.module:function")
        specs = [RewardSpec(name=default[0], options=default[1])]
    fns = []
    for i, spec in enumerate(specs):
        where = f"reward[{i}].options"
        if ":" in spec.name:
            fns.append(_user_reward(spec, i, context))
            continue
        if spec.style != "auto":
            from upslope.errors import ConfigError

            raise ConfigError(f"reward[{i}].style={spec.style}: a calling convention is chosen for user functions "
                              f"(module:function); '{spec.name}' is a registered reward")
        entry = REWARDS.get(spec.name, f"reward[{i}].name")
        fn, label, batched = REWARDS.bind(spec.name, spec.options, where), spec.as_name or spec.name, \
            bool(entry.traits.batched)
        if entry.traits.context:
            import functools

            from upslope.errors import ConfigError

            fn = functools.partial(fn, context=context or RewardContext())
            try:
                fn([], [], [])
            except ConfigError as exc:
                raise ConfigError(f"reward[{i}] ({spec.name}): {exc}") from None
        fns.append(RewardFn(label, spec.weight, fn, batched, places_tokens(spec), answer_check(spec),
                            logprobs=bool(entry.traits.logprobs)))
    return fns


def _user_reward(spec: RewardSpec, i: int, context: RewardContext | None) -> RewardFn:
    """A user function `module:function` in its calling convention (reward[i].style, else detected from
    its signature), with its options bound as keyword arguments."""
    import functools

    fn = load_user_function(spec.name)
    if spec.options:
        fn = functools.partial(fn, **spec.options)
    label = spec.as_name or spec.name.rpartition(":")[2]
    style = spec.style if spec.style != "auto" else detect_style(fn, label, f"reward[{i}]")
    how = (f"set by reward[{i}].style" if spec.style != "auto"
           else f"detected from its signature {signature_text(fn)}")
    if style == "upslope":
        check_per_sample(fn, label)
        return RewardFn(label, spec.weight, fn, note=f"reward '{label}': upslope's per-sample form; {how}")
    styled = StyledReward(fn, style, label, context)
    return RewardFn(label, spec.weight, styled, batched=True, check=styled.check, token_ids=True,
                    note=styled.describe(how))


def answer_check(spec: RewardSpec) -> Callable[[Any], Any] | None:
    """A configured reward's check of a reference answer (its registry trait `answer`, given the
    reward's options); user functions `module:function` have none."""
    if ":" in spec.name:
        return None
    check = REWARDS.get(spec.name).traits.answer
    return None if check is None else (lambda answer: check(answer, spec.options))


def check_rewards(fns: Sequence[RewardFn], examples: Sequence[Any]) -> None:
    """Before the model loads: every reference answer is one its rewards can use (check_answers) and every
    user function's calling convention fits the data (one DataError line naming the row otherwise)."""
    check_answers(fns, examples)
    for rf in fns:
        if rf.check is not None:
            rf.check(examples)


def check_answers(fns: Sequence[RewardFn], examples: Sequence[Any]) -> None:
    """Every example's reference answer is one each reward can compare against: otherwise one
    DataError line naming the example's file:line (an answer such as [4, 5] for the `integer`
    reward was never matched, so those samples only ever scored the fallback, silently)."""
    from upslope.errors import DataError

    for rf in fns:
        if rf.answer_check is None:
            continue
        for i, ex in enumerate(examples):
            try:
                rf.answer_check(ex.answer)
            except ValueError as exc:
                where = ex.meta.get("source", f"example {ex.id or i}")
                raise DataError(f"{where}: answer {ex.answer!r} cannot be checked by reward '{rf.name}' "
                                f"({exc})") from None


def places_tokens(spec: RewardSpec) -> bool:
    """Whether a configured reward puts rewards on tokens (its registry trait `places_tokens`, a
    function of its options); user functions `module:function` do not."""
    if ":" in spec.name:
        return False
    trait = REWARDS.get(spec.name).traits.places_tokens
    return bool(trait(spec.options)) if trait is not None else False


def score(reward_fns: Sequence[RewardFn], completions: Sequence[str], answers: Sequence[Any],
          metas: Sequence[dict[str, Any]], fallback: float = 0.0,
          token_ids: Sequence[list[int]] | None = None,
          logprobs: Sequence[list[float]] | None = None) -> RewardResult:
    """Run every reward on every completion. A reward that raises or returns NaN or inf gives
    the sample `fallback` and is counted; the run goes on. A reward's "does not apply" (TRL's None)
    adds 0 and is counted apart. A SetupError (the machine cannot compute the reward at all) stops
    it. `token_ids`: each completion's tokens, `logprobs` the sampler's log-prob of each, for the rewards
    that take them."""
    n = len(completions)
    comps: dict[str, list[float]] = {}
    weights: dict[str, float] = {}
    failures: dict[str, int] = {}
    errors: dict[str, str] = {}
    placed: dict[str, dict[int, tuple[tuple[int, float], ...]]] = {}
    skipped: dict[str, int] = {}

    def record(name: str, weight: float, i: int, value: Any) -> None:
        comps.setdefault(name, [fallback] * n)
        weights[name] = weight
        if value is NOT_APPLICABLE:
            skipped[name] = skipped.get(name, 0) + 1
            comps[name][i] = 0.0
            return
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v):  # NaN or +-inf: one such value would make every weight NaN
            failures[name] = failures.get(name, 0) + 1
            errors.setdefault(name, f"returned {value!r}")
            v = fallback
        elif isinstance(value, PlacedReward):
            placed.setdefault(name, {})[i] = value.parts
        comps[name][i] = v

    for rf in reward_fns:
        if rf.batched:
            try:
                extra: dict[str, Any] = {"token_ids": token_ids} if rf.token_ids else {}
                if rf.logprobs:
                    extra.update(token_ids=token_ids, logprobs=logprobs)
                values = list(rf.fn(list(completions), list(answers), list(metas), **extra))
            except SetupError:
                raise
            except Exception as exc:
                failures[rf.name] = failures.get(rf.name, 0) + n
                errors.setdefault(rf.name, f"{type(exc).__name__}: {exc}")
                values = [fallback] * n
        else:
            values = []
            for i in range(n):
                try:
                    values.append(rf.fn(completions[i], answers[i], metas[i]))
                except SetupError:
                    raise
                except Exception as exc:
                    failures[rf.name] = failures.get(rf.name, 0) + 1
                    errors.setdefault(rf.name, f"{type(exc).__name__}: {exc}")
                    values.append(_FAILED)
        for i, v in enumerate(values):
            if v is _FAILED:
                comps.setdefault(rf.name, [fallback] * n)
                weights[rf.name] = rf.weight
                continue
            if isinstance(v, dict):
                for key, sub in v.items():
                    record(f"{rf.name}/{key}", rf.weight, i, sub)
            else:
                record(rf.name, rf.weight, i, v)
    return RewardResult(comps, weights, failures, errors, placed, skipped)


def combined(result: RewardResult, group_ids: Sequence[int] | None = None,
             combiner: Callable[..., Any] | None = None) -> list[float]:
    """The combined reward per sample through a reward_combiner plugin (default: weighted_sum)."""
    import torch

    from upslope.registry import REWARD_COMBINERS

    if not result.components:
        return []
    comps = {k: torch.tensor(v, dtype=torch.float32) for k, v in result.components.items()}
    n = len(next(iter(comps.values())))
    gids = torch.as_tensor(list(group_ids) if group_ids is not None else range(n), dtype=torch.long)
    fn = combiner or REWARD_COMBINERS.bind("weighted_sum")
    return fn(comps, gids, weights=result.weights).float().tolist()


def status_counts(metas: Sequence[dict[str, Any]], key: str = "sandbox_status") -> dict[str, int]:
    """How many samples a reward marked with each status (e.g. the code reward's sandbox
    outcome: ok, failed, timeout, memory, syntax_error, ...)."""
    counts: dict[str, int] = {}
    for m in metas:
        if key in m:
            counts[str(m[key])] = counts.get(str(m[key]), 0) + 1
    return counts
