"""Registries: plugin lookup by name, option checking against the plugin's keyword-only
signature (names and types), and the errors a typo produces."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from upslope.errors import ConfigError
from upslope.registry import REGISTRIES, REWARDS, TASKS, Registry, Traits, load_builtins

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True)
class WidgetTraits(Traits):
    batched: bool = False  # takes every sample in one call


@pytest.fixture
def reg() -> Registry:
    r: Registry = Registry("widget", WidgetTraits)

    @r.register("scale", batched=True)
    def scale(x: float, *, factor: float = 2.0, mode: Literal["up", "down"] = "up", count: int = 1,
              tags: list[str] | None = None) -> float:
        """Scale a number.

        Longer description that is not part of the one-line doc."""
        return x * factor if mode == "up" else x / factor

    @r.register("noop")
    def noop(x):
        return x

    return r


def test_register_get_and_attrs(reg):
    entry = reg.get("scale")
    assert entry.doc == "Scale a number."
    assert entry.shown_traits() == {"batched": True}
    assert list(entry.options()) == ["factor", "mode", "count", "tags"]  # keyword-only only, not x
    assert reg.names() == ["noop", "scale"] and "scale" in reg and "nope" not in reg


def test_traits_are_typed_fields_checked_when_registering(reg):
    """A registry declares its traits: a misspelt trait or one of the wrong type is an error where the
    plugin registers (never a silent False when read), and callers read attributes."""
    from upslope.registry import ADVANTAGES

    with pytest.raises(TypeError, match="widget 'x': unknown trait 'bached' \\(did you mean 'batched'\\?\\)"):
        reg.register("x", bached=True)
    with pytest.raises(TypeError, match="widget 'x': trait batched: Input should be a valid boolean"):
        reg.register("x", batched="sometimes")
    assert reg.get("scale").traits.batched is True and reg.get("noop").traits.batched is False
    with pytest.raises(TypeError, match="salience='attention_flow' needs an option answer_tokens"):
        ADVANTAGES.register("test_salience_without_answer", salience="attention_flow")(lambda batch, salience=None: 0)
    assert ADVANTAGES.get("flowtracer").traits.salience == "attention_flow"


def test_bind_applies_and_coerces_options(reg):
    fn = reg.bind("scale", {"factor": 3, "mode": "down"})
    assert fn(6.0) == 2.0
    assert fn.keywords == {"factor": 3.0, "mode": "down"}
    assert reg.bind("scale", {"count": "4"}).keywords["count"] == 4  # "4" from YAML text is an int option
    assert reg.bind("scale")(5.0) == 10.0  # defaults


def test_bind_unknown_option_suggests_closest(reg):
    with pytest.raises(ConfigError) as info:
        reg.bind("scale", {"factr": 3}, where="algo.widget.options")
    msg = str(info.value)
    assert msg.startswith("algo.widget.options.factr: unknown option for widget 'scale'")
    assert "did you mean 'factor'?" in msg
    assert "valid: factor, mode, count, tags" in msg


def test_bind_option_on_plugin_without_options(reg):
    with pytest.raises(ConfigError, match="unknown option for widget 'noop'.*valid: none"):
        reg.bind("noop", {"x": 1})


@pytest.mark.parametrize("options, fragment", [
    ({"factor": "big"}, "factor: Input should be a valid number"),
    ({"mode": "sideways"}, "mode: Input should be 'up' or 'down'"),
    ({"count": 1.5}, "count: Input should be a valid integer"),
    ({"tags": "a"}, "tags: Input should be a valid list"),
])
def test_bind_validates_option_types(reg, options, fragment):
    with pytest.raises(ConfigError) as info:
        reg.bind("scale", options, where="w")
    assert str(info.value).startswith("w." + fragment)
    assert f"(got {next(iter(options.values()))!r})" in str(info.value)


def test_unknown_plugin_lists_known_and_suggests(reg):
    with pytest.raises(ConfigError) as info:
        reg.get("scal", where="algo.widget.name")
    msg = str(info.value)
    assert msg.startswith("algo.widget.name: unknown widget 'scal' (did you mean 'scale'?)")
    assert msg.endswith("known: noop, scale")


def test_register_twice_is_an_error(reg):
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("scale")(lambda x: x)


def test_builtin_rewards_and_tasks_are_registered():
    for name in ("integer", "exact", "format", "math"):
        assert REWARDS.get(name).name == name  # get() loads the built-in plugin modules lazily
    assert {"arith", "gsm8k", "math500", "aime24", "amc23"} <= set(TASKS.names())
    assert TASKS.get("arith").traits.reward == "integer"
    assert TASKS.get("gsm8k").traits.reward == "math"


def test_builtin_plugin_option_types_are_checked():
    """Built-in plugins live in modules with postponed (string) annotations; their option
    types must still be validated."""
    with pytest.raises(ConfigError, match="strict: Input should be a valid boolean"):
        REWARDS.bind("integer", {"strict": "maybe"}, where="reward[0].options")
    with pytest.raises(ConfigError, match="extract: Input should be 'first', 'first_result', 'last'"):
        REWARDS.bind("integer", {"extract": "middle"}, where="reward[0].options")
    with pytest.raises(ConfigError, match="digits: Input should be a valid integer"):
        TASKS.bind("arith", {"digits": "two"}, where="data.options")
    assert REWARDS.bind("integer", {"strict": "false"}).keywords == {"strict": False}


def test_unknown_builtin_reward_suggests():
    with pytest.raises(ConfigError, match=r"unknown reward 'integr' \(did you mean 'integer'\?\); known: .*math"):
        REWARDS.get("integr")


# Numeric options of built-in plugins that take any value by design (reward-scale thresholds and rewards, a
# seed, a margin that may be negative): every other int or float option declares its bounds (upslope.bounds).
UNBOUNDED = {
    "advantage:codapo.threshold", "advantage:consteer.threshold", "advantage:ispo.threshold",
    "sampler:boundary.threshold", "sampler:boundary_aware.threshold", "sampler:cero.threshold",
    "sampler:td_grokking.threshold", "replay:rerule.hard_below",  # compared with rewards, whatever their scale
    "sampler:bmc.threshold",
    "reward:segmented.empty_reward", "reward_combiner:more.violation",  # rewards: a penalty is negative
    "reward:opera.scale",  # its sign too: a negative scale rewards rising uncertainty
    "advantage:tree.min_informativeness",  # below the lowest informativeness: no tree filtered
    "reward:brier_confidence.correct_bonus", "reward:selective.abstain_reward",  # checked against each other
    "rollout:espo.fail_reward", "environment:answer.tool_bonus",  # rewards: a penalty is negative
    "rollout:espo.margin",  # a negative margin stops every completion past min_tokens
    "preference_loss:simpo.gamma",  # a target margin
    "accept:mipu.min_gain",  # a threshold on the proxy, which has either sign
    "task:arith.seed", "task:sql.seed", "task:knapsack.seed", "task:self_report.seed",  # a generator's seed:
    "task:reasoning_gym.seed",  # any integer it takes
    "reward:knapsack.infeasible",  # a penalty is negative
    "preference_loss:bro.threshold", "preference_loss:bro.shift",  # compared with rewards / implicit rewards
    "sampler:codapo.threshold",  # compared with rewards
    "distill_loss:arkd.init_a", "distill_loss:arkd.init_b",  # a logistic's starting parameters: any real
    "distill_loss:arkd.seed",  # its exploration noise's seed: any integer
}


def builtin_numeric_options():
    """(kind:name.option, registry, plugin, option, annotation) of every int or float option of a built-in plugin."""
    import inspect  # noqa: PLC0415
    from typing import Annotated, get_args, get_origin  # noqa: PLC0415

    from upslope import registry as R  # noqa: PLC0415

    for reg in (v for v in vars(R).values() if isinstance(v, Registry)):
        for entry in reg.entries():
            if not entry.module.startswith("upslope."):
                continue
            for name, p in entry.options().items():
                ann = p.annotation
                base = get_args(ann)[0] if get_origin(ann) is Annotated else ann
                if base in (int, float) and p.default is not inspect.Parameter.empty:
                    yield f"{reg.kind}:{entry.name}.{name}", reg, entry.name, name, ann


def test_every_numeric_builtin_option_declares_its_bounds():
    """A new int/float plugin option states its range (one bind-time error line for a value outside it) or is
    listed above with the reason it is unbounded."""
    from typing import Annotated, get_origin  # noqa: PLC0415

    found = {key: get_origin(ann) is Annotated for key, *_, ann in builtin_numeric_options()}
    assert len(found) > 100
    assert sorted(k for k, bounded in found.items() if not bounded and k not in UNBOUNDED) == []
    assert sorted(UNBOUNDED - {k for k, bounded in found.items() if not bounded}) == []  # no stale entries


def test_a_bounded_builtin_option_out_of_range_is_one_error_line_at_bind():
    """For every bounded option: its default binds, and a value just past each bound is refused by bind in one
    line naming the option and the bound (e.g. `agent.env.options.hints: Input should be greater than or equal to
    0 (got -1)`)."""
    from typing import get_args  # noqa: PLC0415

    checked = 0
    for key, reg, plugin, name, ann in builtin_numeric_options():
        if key in UNBOUNDED:
            continue
        base, *meta = get_args(ann)
        default = reg.get(plugin).options()[name].default
        reg.bind(plugin, {name: default}, where="opts")
        bounds = {b: getattr(m, b) for info in meta for m in getattr(info, "metadata", [info])
                  for b in ("gt", "ge", "lt", "le") if getattr(m, b, None) is not None}
        step = 1 if base is int else 1e-3
        outside = {"gt": lambda v: v, "ge": lambda v: v - step, "lt": lambda v: v, "le": lambda v: v + step}
        for b, v in bounds.items():
            bad = base(outside[b](v))
            with pytest.raises(ConfigError) as err:
                reg.bind(plugin, {name: bad}, where="opts")
            msg = str(err.value)
            assert msg.startswith(f"opts.{name}: Input should be ") and f"(got {bad!r})" in msg and "\n" not in msg
            checked += 1
    assert checked > 100


def test_every_pattern_option_is_a_checked_regex_and_no_option_takes_a_bool_for_a_number():
    """A plugin option named like a pattern is `bounds.Regex`, so `(` is refused at bind in one line
    instead of failing at the first reply; a number option refuses true/false (pydantic would read 1)."""
    from upslope.bounds import Regex  # noqa: PLC0415

    load_builtins()
    patterns = [(reg, entry.name, name, p.annotation) for reg in REGISTRIES.values() for entry in reg._entries.values()
                for name, p in entry.options().items() if "pattern" in name]
    assert len(patterns) >= 3
    assert [f"{reg.kind}:{plugin}.{name}" for reg, plugin, name, ann in patterns if ann != Regex] == []
    for reg, plugin, name, _ in patterns:
        with pytest.raises(ConfigError, match=rf"^opts\.{name}: Value error, not a regular expression"):
            reg.bind(plugin, {name: "("}, where="opts")
    for key, reg, plugin, name, _ in list(builtin_numeric_options())[:40]:
        with pytest.raises(ConfigError, match=rf"^opts\.{name}: expected (int|float), not true$"):
            reg.bind(plugin, {name: True}, where="opts")
