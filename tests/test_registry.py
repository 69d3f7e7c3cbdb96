"""Registries: plugin lookup by name, option checking against the plugin's keyword-only
signature (names and types), and the errors a typo produces."""
from __future__ import annotations

from typing import Literal

import pytest

from upslope.errors import ConfigError
from upslope.registry import REWARDS, TASKS, Registry

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def reg() -> Registry:
    r: Registry = Registry("widget")

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
    assert entry.attrs == {"batched": True}
    assert list(entry.options()) == ["factor", "mode", "count", "tags"]  # keyword-only only, not x
    assert reg.names() == ["noop", "scale"] and "scale" in reg and "nope" not in reg


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
    assert TASKS.get("arith").attrs["reward"] == "integer"
    assert TASKS.get("gsm8k").attrs["reward"] == "math"


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
