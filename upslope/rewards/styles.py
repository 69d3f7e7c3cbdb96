"""Calling conventions of user reward functions (`module:function`), so a reward written for another
framework runs unchanged: upslope's own `fn(completion, answer, meta)` (one sample a call) and its
batched `fn(completions, answers, metas)`; TRL's `fn(completions, **columns)` (batched, keyword
arguments: `prompts`, `completions`, `completion_ids`, `trainer_state` and every dataset column; a
None in the returned list means "does not apply"); verl's `compute_score(data_source, solution_str,
ground_truth, extra_info)` returning a float or a dict with a "score"; OpenRLHF's
`reward_func(queries, prompts, labels)`.

The convention is detected from the signature (or set with `reward[i].style`), and checked against the
data before the model loads: the arguments the data can supply must bind, and one call on the first
row with a placeholder completion must return what the convention promises."""
from __future__ import annotations

import asyncio
import inspect
import math
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from upslope.data.types import Example
from upslope.errors import ConfigError, DataError
from upslope.rewards.context import RewardContext

FORMS = {
    "upslope": "fn(completion, answer, meta) -> float (one sample a call)",
    "batched": "fn(completions, answers, metas) -> list of floats",
    "trl": "TRL's fn(completions, **columns) -> list of floats or None (also prompts, completion_ids, trainer_state)",
    "verl": "verl's compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float or "
            "{'score': float, ...}",
    "openrlhf": "OpenRLHF's reward_func(queries, prompts, labels) -> list of floats or {'rewards': ...}",
}
STYLES = ("auto", *FORMS)
TRL_ARGS = ("prompts", "completions", "completion_ids", "trainer_state")
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
PLACEHOLDER = "0"  # the completion of the call made at setup to check a function against the data


class NotApplicable:
    """A reward's "does not apply to this sample" (TRL's None): nothing added to the combined reward."""

    def __repr__(self) -> str:
        return "None"


NOT_APPLICABLE = NotApplicable()


class ShapeError(ValueError):
    """A reward function returned something its calling convention does not allow."""


def signature_text(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def detect_style(fn: Callable[..., Any], label: str, where: str) -> str:
    """The calling convention a signature fits: verl's by `solution_str`, OpenRLHF's by `queries`,
    upslope's batched form by `completions, answers, metas`, TRL's by `completions` (or keyword arguments
    only), else upslope's per-sample form if three positional arguments bind. None or several: one
    ConfigError line naming the accepted forms."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigError(f"reward '{label}': not a function with a signature") from None
    params = list(sig.parameters.values())
    names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    own_batched = {"completions", "answers", "metas"} <= names  # upslope's batched form, by its names
    fits = [style for style, hit in (("verl", "solution_str" in names), ("openrlhf", "queries" in names),
                                     ("batched", own_batched),
                                     ("trl", not own_batched and ("completions" in names or (var_kw and not positional))))
            if hit]
    if not fits and _binds(sig, 3):
        fits = ["upslope"]
    if len(fits) == 1:
        return fits[0]
    forms = "; ".join(f"{k}: {v}" for k, v in FORMS.items())
    what = f"fits both the {fits[0]} and {fits[1]} forms" if fits else "fits none of the accepted forms"
    raise ConfigError(f"reward '{label}': signature {sig} {what} ({forms}); name the form with {where}.style")


def _binds(sig: inspect.Signature, n: int) -> bool:
    try:
        sig.bind(*range(n))
        return True
    except TypeError:
        return False


class StyledReward:
    """A user function called in its own convention, as upslope's batched reward
    `(completions, answers, metas) -> list`; `check(examples)` tests it against the data at setup."""

    def __init__(self, fn: Callable[..., Any], style: str, label: str, context: RewardContext | None = None):
        self.fn, self.style, self.label = fn, style, label
        self.context = context or RewardContext()
        self.signature = inspect.signature(fn)
        params = self.signature.parameters.values()
        self.accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
        self.names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self.columns: list[str] | None = None  # the data's columns, learned in check()
        self.is_async = inspect.iscoroutinefunction(getattr(fn, "func", fn))
        self.__name__ = label

    # ------------------------------------------------------------ calls

    def __call__(self, completions: Sequence[str], answers: Sequence[Any], metas: Sequence[dict[str, Any]],
                 token_ids: Sequence[list[int]] | None = None) -> list[Any]:
        call = {"batched": self._batched, "trl": self._trl, "verl": self._verl, "openrlhf": self._openrlhf}[self.style]
        return call(list(completions), list(answers), list(metas), token_ids)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        return asyncio.run(out) if self.is_async or inspect.iscoroutine(out) else out

    def _keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments the function takes (all of them when it has **kwargs)."""
        return kwargs if self.accepts_any else {k: v for k, v in kwargs.items() if k in self.names}

    def _batched(self, completions: list[str], answers: list[Any], metas: list[dict[str, Any]],
                 token_ids: Sequence[list[int]] | None) -> list[Any]:
        return _as_list(self._run(completions, answers, metas), len(completions), self.label)

    def _trl(self, completions: list[str], answers: list[Any], metas: list[dict[str, Any]],
             token_ids: Sequence[list[int]] | None) -> list[Any]:
        chat = bool(metas) and isinstance(metas[0].get("prompt"), list)  # TRL: conversational data, message lists
        kwargs: dict[str, Any] = {
            "prompts": [m.get("prompt") for m in metas],
            "completions": [[{"role": "assistant", "content": c}] for c in completions] if chat else completions,
            "completion_ids": list(token_ids) if token_ids is not None else [None] * len(completions),
            "trainer_state": SimpleNamespace(global_step=self.context.step, max_steps=self.context.total_steps),
        }
        for col in self._columns(metas):
            kwargs.setdefault(col, [m.get(col) for m in metas])
        values = _as_list(self._run(**self._keywords(kwargs)), len(completions), self.label)
        return [NOT_APPLICABLE if v is None else v for v in values]

    def _columns(self, metas: list[dict[str, Any]]) -> list[str]:
        if self.columns is not None:
            return self.columns
        return [k for k in (metas[0] if metas else {}) if k not in ("prompt", "completion", "source")]

    def _verl(self, completions: list[str], answers: list[Any], metas: list[dict[str, Any]],
              token_ids: Sequence[list[int]] | None) -> list[Any]:
        out = []
        for c, a, m in zip(completions, answers, metas):
            got = self._run(**self._keywords({"data_source": m.get("data_source"), "solution_str": c,
                                              "ground_truth": a, "extra_info": m.get("extra_info")}))
            out.append(self._score_of(got, m))
        return out

    def _score_of(self, got: Any, meta: dict[str, Any]) -> Any:
        """verl's result: a number, or a dict whose 'score' is the reward and whose other numbers are
        logged (as `<reward>/<key>` means of the batch)."""
        if not isinstance(got, dict):
            return got
        if "score" not in got:
            raise ShapeError(f"returned a dict without 'score' (keys: {', '.join(map(str, got))})")
        extras = meta.setdefault("metrics", {})
        for k, v in got.items():
            if k != "score" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                extras[f"{self.label}/{k}"] = float(v)
        return got["score"]

    def _openrlhf(self, completions: list[str], answers: list[Any], metas: list[dict[str, Any]],
                  token_ids: Sequence[list[int]] | None) -> list[Any]:
        prompts = [self._prompt_text(m.get("prompt")) for m in metas]
        got = self._run([p + c for p, c in zip(prompts, completions)], prompts, answers)
        if isinstance(got, dict):
            if "rewards" not in got:
                raise ShapeError(f"returned a dict without 'rewards' (keys: {', '.join(map(str, got))})")
            got = got["rewards"]
        return _as_list(got, len(completions), self.label)

    def _prompt_text(self, prompt: Any) -> str:
        """The prompt as the model read it: through the policy's chat template when there is one."""
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
        tok = self.context.policy_tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(str(m.get("content", "")) for m in msgs)

    # ------------------------------------------------------------ set-up check

    def check(self, examples: Sequence[Example]) -> None:
        """Before the model loads: the arguments the data supplies bind, and one call on the first row with
        a placeholder completion returns the convention's shape (other errors of that call are the
        placeholder's, and are left to the run)."""
        if not examples:
            return
        first = examples[0]
        where = first.meta.get("source", f"example {first.id or 0}")
        self.columns = sorted({k for ex in examples[:1000] for k in ex.meta if k != "source"})
        supplied = {"trl": set(TRL_ARGS) | set(self.columns), "verl": set(VERL_ARGS)}.get(self.style)
        if supplied is not None:
            missing = [p.name for p in self.signature.parameters.values() if p.default is p.empty
                       and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in supplied]
            if missing:
                has = ", ".join(self.columns) or "none"
                raise DataError(f"{where}: reward '{self.label}' ({self.style} form) takes '{missing[0]}', which the "
                                f"data does not supply (columns: {has}); add that column or give it a default")
        meta = {**first.meta, "prompt": first.prompt, "answer": first.answer, "completion": PLACEHOLDER,
                "example_id": first.id}
        try:
            self([PLACEHOLDER], [first.answer], [meta], [[0]])
        except ShapeError as exc:
            raise DataError(f"{where}: reward '{self.label}' ({FORMS[self.style]}) {exc}") from None
        except KeyError as exc:
            key = exc.args[0] if exc.args else None
            if isinstance(key, str) and key not in self.columns and key not in TRL_ARGS:
                raise DataError(f"{where}: reward '{self.label}' reads column '{key}', which the data lacks "
                                f"(columns: {', '.join(self.columns) or 'none'})") from None
        except Exception:  # noqa: BLE001 - the placeholder is not a real completion; the run reports real failures
            pass

    def describe(self, how: str) -> str:
        return f"reward '{self.label}': {FORMS[self.style]}; {how}"


def _as_list(got: Any, n: int, label: str) -> list[Any]:
    """A batched reward's result as a list of n values (a list, tuple, numpy array or tensor)."""
    if hasattr(got, "tolist") and not isinstance(got, (list, tuple)):
        got = got.tolist()
    if not isinstance(got, (list, tuple)):
        raise ShapeError(f"returned {type(got).__name__} {repr(got)[:40]}, expected a list of {n} values")
    if len(got) != n:
        raise ShapeError(f"returned {len(got)} values for {n} completions")
    return list(got)


def check_per_sample(fn: Callable[..., Any], label: str) -> None:
    """upslope's per-sample form set by hand: three positional arguments must bind."""
    if not _binds(inspect.signature(fn), 3):
        raise ConfigError(f"reward '{label}': signature {signature_text(fn)} cannot take the upslope form's "
                          f"arguments, {FORMS['upslope']}")
