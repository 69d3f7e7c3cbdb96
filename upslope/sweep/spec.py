"""What an `upslope sweep` searches: the typed, validated sweep settings (from a sweep file, the
command line, or both), the search space, and the check of every value against the config before
any trial runs."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from upslope.config_base import Section, opt
from upslope.errors import ConfigError, did_you_mean
from upslope.yaml_strict import load_yaml, parse_value


class Range(Section):
    """A range a sweep samples from: exactly one of log_uniform, uniform, int_uniform, as [low, high]."""

    log_uniform: tuple[float, float] | None = opt(None, "sample log-uniformly in [low, high] (0 < low < high)")
    uniform: tuple[float, float] | None = opt(None, "sample uniformly in [low, high] (low < high)")
    int_uniform: tuple[int, int] | None = opt(None, "sample an integer uniformly in [low, high] (low <= high)")

    @model_validator(mode="after")
    def _one_range(self) -> "Range":
        given = [(k, v) for k, v in self.__dict__.items() if v is not None]
        if len(given) != 1:
            raise ValueError("a range is exactly one of {log_uniform: [low, high]}, {uniform: [low, high]}, "
                             "{int_uniform: [low, high]}")
        kind, (low, high) = given[0]
        if low > high or (low == high and kind != "int_uniform") or (kind == "log_uniform" and low <= 0):
            raise ValueError(f"{kind}: [{low}, {high}] is not a range (low < high{', low > 0' if kind == 'log_uniform' else ''})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k, v in self.__dict__.items() if v is not None)

    @property
    def bounds(self) -> tuple[float, float]:
        return getattr(self, self.kind)


def dimension(key: str, value: Any) -> list[Any] | Range:
    """A space entry as a non-empty list of values or a Range; anything else is a ValueError naming the key."""
    if isinstance(value, Range):
        return value
    if isinstance(value, dict):
        try:
            return Range.model_validate(value)
        except ValidationError as exc:
            raise ValueError(f"{key}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    if isinstance(value, list) and value:
        return value
    raise ValueError(f"{key}: expected a non-empty list of values or a range such as {{log_uniform: [1.0e-6, 1.0e-4]}}, "
                     f"got {value!r}")

# options the sweep sets on every trial (its rungs, run directory and evaluation schedule)
CONTROLLED = ("run_dir", "train.steps", "train.stop_after", "train.resume", "train.save_every", "train.eval_at",
              "train.eval_every", "train.eval_before", "train.eval_after")
# what the evaluation summary logs as eval/<key> (besides pass@k and maj@k for k in eval.k)
EVAL_KEYS = ("accuracy", "mean_reward", "mean_length", "truncated_frac", "prompts", "samples", "gen_seconds",
             "tokens_per_s")


class SweepSpec(Section):
    """`upslope sweep`: successive halving over trials of an upslope command on one recipe. Every trial
    starts at the first rung; after each rung the best 1/eta (by `metric`) continue to the next one,
    resumed from their own checkpoint; the rest stop."""

    recipe: str | None = opt(None, "the recipe every trial runs (a sweep file's is relative to that file)")
    command: str = opt("train", "the upslope command a trial runs (train, sft, rft, dpo, distill, rm, randopt)")
    space: dict[str, Any] = opt({}, "option -> values to try (a list) or a range ({log_uniform: [lo, hi]}, "
                                          "uniform, int_uniform); CLI: --space KEY=V1,V2 or KEY=log_uniform:LO:HI")
    budget: int = opt(8, "trials started at the first rung (a grid with fewer points runs each point once)", ge=1)
    metric: str = opt("eval/accuracy", "metric trials are ranked by at each rung: a key of the trial's "
                                       "metrics.jsonl at the rung's step (eval/* is evaluated there)")
    goal: Literal["max", "min"] = opt("max", "whether a higher (max) or lower (min) metric is better")
    rungs: list[Annotated[int, Field(ge=1)]] | None = opt(
        None, "training steps a surviving trial has reached at each rung, increasing (default: one rung at "
              "the recipe's train.steps, i.e. no early stopping); CLI: --rungs 10,20,40")
    eta: int = opt(3, "keep the best 1/eta of the trials at each rung (at least one)", ge=2)
    trend_metric: str | None = opt(None, "training metric whose trend stops a trial at a rung when flat or "
                                         "collapsing (JF-HPO's training dynamics, e.g. reward/mean; default: off)")
    trend_goal: Literal["max", "min"] = opt("max", "whether trend_metric improves upward (max) or downward (min)")
    trend_window: int = opt(5, "logged values of trend_metric (the last ones up to the rung) its trend is read from",
                            ge=2)
    trend_min_slope: float = opt(0.0, "flat: the least-squares slope per step over the window, in trend_goal's "
                                      "direction, is at or below this")
    trend_drop: float = opt(0.5, "collapsing: the latest value is worse than the window's best by more than this "
                                 "(in the metric's units)", ge=0)
    proxy: str | None = opt(None, "model.name of every trial: a small proxy of the recipe's model (JF-HPO); "
                                  "the best config is written for the recipe's own model")
    overrides: list[str] = opt([], "key=value overrides for every trial (CLI: given after the recipe)")
    out: str = opt("runs/sweep", "sweep directory: sweep.json (state), trials/, results.json, results.csv, best.yaml")
    seed: int = opt(0, "seed of the configurations drawn from the space")
    keep_checkpoints: bool = opt(False, "keep the checkpoints of trials that stopped early (default: deleted once "
                                        "a trial stops; its metrics stay)")
    executor: Literal["subprocess", "inprocess"] = opt(
        "subprocess", "run each trial as `python -m upslope.cli COMMAND ...` (one at a time) or in this process "
                      "(no start-up per trial; HF engine only, vLLM hosts one engine per process)")

    @model_validator(mode="after")
    def _has_space(self) -> "SweepSpec":
        if not self.space:
            raise ValueError("space: empty; give at least one option to search, e.g. --space optim.lr=1e-6,1e-5")
        return self

    @field_validator("space")
    @classmethod
    def _space(cls, space: dict[str, Any]) -> dict[str, Any]:
        for key in space:
            if key in CONTROLLED:
                raise ValueError(f"{key} is set by the sweep for every trial (its steps: --rungs)")
        return {key: dimension(key, value) for key, value in space.items()}

    @field_validator("rungs")
    @classmethod
    def _rungs(cls, rungs: list[int] | None) -> list[int] | None:
        if rungs is not None and (not rungs or any(b <= a for a, b in zip(rungs, rungs[1:]))):
            raise ValueError(f"{rungs} must be increasing step counts, e.g. [10, 20, 40]")
        return rungs

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        from upslope.launch import TRAINERS

        if command not in TRAINERS:
            hint = did_you_mean(command, TRAINERS)
            raise ValueError(f"'{command}' is not a training command{hint}; known: {', '.join(TRAINERS)}")
        return command

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, overrides: list[str]) -> list[str]:
        for item in overrides:
            key = item.partition("=")[0].strip()
            if "=" not in item:
                raise ValueError(f"'{item}': expected key=value")
            if key in CONTROLLED:
                raise ValueError(f"{key} is set by the sweep for every trial (its steps: --rungs)")
        return overrides

    def identity(self) -> dict[str, Any]:
        """What decides the sweep's results (a killed sweep continues only with the same identity)."""
        return self.model_dump(mode="json", exclude={"executor", "keep_checkpoints"})


def parse_dimension(text: str) -> Any:
    """A --space value: `lo_kind:LOW:HIGH` for a range, a YAML list `[a, b]`, else comma-separated
    values (each read as YAML, like an override)."""
    m = re.fullmatch(r"(log_uniform|uniform|int_uniform):([^:]+):([^:]+)", text.strip())
    if m:
        return {m[1]: [m[2], m[3]]}
    if text.strip().startswith("["):
        return _yaml(text)
    return [_yaml(part) for part in text.split(",")]


NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _yaml(text: str) -> Any:
    """A value as YAML reads it, except that 1e-6 is a number (YAML 1.1 wants 1.0e-6)."""
    value = parse_value(text, "upslope sweep --space") if text.strip() else ""
    return float(value) if isinstance(value, str) and NUMBER.fullmatch(value.strip()) else value


def yaml_value(value: Any) -> str:
    """`value` as the text of a key=value override (1e-06 as 1.0e-06, so YAML reads a float back)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    return text.removesuffix("...").strip()


def is_sweep_file(path: str) -> bool:
    """A YAML mapping with a `space` (a recipe cannot have one: Config forbids unknown keys)."""
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    try:
        data = load_yaml(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "space" in data


def read_sweep_file(path: str) -> dict[str, Any]:
    """A sweep file's settings, its recipe made relative to the working directory, overrides as key=value."""
    p = Path(path)
    data = load_yaml(p.read_text(encoding="utf-8"))
    if isinstance(data.get("recipe"), str) and data["recipe"]:  # any other value is left for make_spec to refuse
        data["recipe"] = str((p.parent / data["recipe"]).resolve())
    if isinstance(data.get("overrides"), dict):
        data["overrides"] = [f"{k}={yaml_value(v)}" for k, v in data["overrides"].items()]
    return data


def make_spec(raw: dict[str, Any], source: str = "upslope sweep") -> SweepSpec:
    """Validate sweep settings: a wrong key or value is one ConfigError line naming it."""
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(x) for x in err["loc"] if not str(x).startswith(("list[", "Annotated", "function-"))]
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            hint = did_you_mean(loc[0], SweepSpec.model_fields, paren=False)
            raise ConfigError(f"{source}: unknown setting '{loc[0]}'{hint} (valid: "
                              f"{', '.join(SweepSpec.model_fields)})") from None
        given = err.get("input")
        msg = err["msg"].removeprefix("Value error, ")
        shown = "" if isinstance(given, (dict, SweepSpec)) or repr(given) in msg else f" (got {given!r})"
        where = f"{'.'.join(loc)}: " if loc else ""
        raise ConfigError(f"{source}: {where}{msg}{shown}") from None


def spec_from_args(target: str | None, flags: dict[str, Any], overrides: list[str]) -> SweepSpec:
    """The sweep of `upslope sweep TARGET --flag ... key=value`: TARGET a recipe or a sweep file; flags
    and overrides given on the command line win over the file's (its space entries are extended)."""
    raw: dict[str, Any] = {}
    source = "upslope sweep"
    if target and is_sweep_file(target):
        raw, source = read_sweep_file(target), target
    elif target:
        raw["recipe"] = target
    for key, value in flags.items():
        if key == "space":
            raw["space"] = {**(raw.get("space") or {}), **value}
        else:
            raw[key] = value
    if overrides:
        raw["overrides"] = [*(raw.get("overrides") or []), *overrides]
    return make_spec(raw, source)
