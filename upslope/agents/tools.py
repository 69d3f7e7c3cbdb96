"""Tools: typed Python functions offered to the model. Their JSON schema comes from the
signature and docstring; calls run with a timeout, and every failure (bad arguments, an
exception, a timeout, an unknown tool) comes back to the model as a tool message."""
from __future__ import annotations

import concurrent.futures
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union, get_args, get_origin

from pydantic import TypeAdapter, ValidationError

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a model turn; `error` says why it cannot run (bad JSON, no name, ...)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class ToolTurn:
    """What the tool calls of one model turn produced: the tool messages and how many calls were valid."""

    messages: list[dict[str, str]]
    calls: int
    valid: int


def tool_name(fn: Callable[..., Any]) -> str:
    """The name a tool is offered under (its `tool_name` attribute, else the function's name)."""
    return str(getattr(fn, "tool_name", None) or getattr(fn, "__name__", "tool"))


def _arguments(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The parameters the model fills: positional-or-keyword ones (keyword-only ones are configuration)."""
    sig = inspect.signature(fn, eval_str=True)
    return {n: p for n, p in sig.parameters.items()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)}


def _json_type(ann: Any) -> dict[str, Any]:
    """JSON-schema type of a Python annotation (Optional and list[...] included; unknown: no constraint)."""
    if ann in _JSON_TYPES:
        return {"type": _JSON_TYPES[ann]}
    origin, args = get_origin(ann), get_args(ann)
    if origin in (list, tuple, set):
        return {"type": "array", **({"items": _json_type(args[0])} if args else {})}
    if origin is dict:
        return {"type": "object"}
    if origin is Union or str(origin) == "<class 'types.UnionType'>":
        inner = [a for a in args if a is not type(None)]
        return _json_type(inner[0]) if len(inner) == 1 else {}
    return {}


def _param_help(fn: Callable[..., Any]) -> dict[str, str]:
    """`name: help` lines of the docstring after its first paragraph (the project's option convention)."""
    doc = inspect.getdoc(fn) or ""
    _, _, rest = doc.partition("\n\n")
    out = {}
    for line in rest.splitlines():
        name, sep, text = line.strip().partition(":")
        if sep and name.isidentifier():
            out[name] = text.strip()
    return out


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style function schema of a tool: name, first docstring paragraph, typed parameters."""
    helps = _param_help(fn)
    props: dict[str, Any] = {}
    required = []
    for name, p in _arguments(fn).items():
        prop = _json_type(p.annotation) if p.annotation is not inspect.Parameter.empty else {}
        if name in helps:
            prop["description"] = helps[name]
        props[name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(name)
    summary = " ".join((inspect.getdoc(fn) or "").partition("\n\n")[0].split())
    return {"type": "function", "function": {"name": tool_name(fn), "description": summary,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


def check_arguments(fn: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments validated (and coerced) against the tool's annotations; a ValueError says what is wrong."""
    params = _arguments(fn)
    unknown = [k for k in arguments if k not in params]
    if unknown:
        raise ValueError(f"unknown argument {unknown[0]!r}; expected {', '.join(params) or 'none'}")
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in arguments]
    if missing:
        raise ValueError(f"missing argument {missing[0]!r}")
    out = {}
    for k, v in arguments.items():
        ann = params[k].annotation
        if ann is inspect.Parameter.empty:
            out[k] = v
            continue
        try:
            out[k] = TypeAdapter(ann).validate_python(v)
        except ValidationError as exc:
            raise ValueError(f"argument {k!r}: {exc.errors()[0]['msg']} (got {v!r})") from None
    return out


def truncate(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters: its head and its tail (where an error's last line is),
    with a note saying how much was cut between them."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit - limit * 2 // 3
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[len(text) - tail:]}"


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="upslope-tool")


def call_tool(fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float) -> tuple[str, bool]:
    """Run one tool call: (its result as text, whether it ran without error). Errors and timeouts
    become text for the model. A timed-out Python function cannot be killed: its thread runs on
    (tools that may hang should bound themselves, as the sandboxed `python` tool does)."""
    try:
        args = check_arguments(fn, arguments)
    except ValueError as exc:
        return f"error: {exc}", False
    future = _POOL.submit(fn, **args)
    try:
        out = future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        return f"error: the tool took longer than {timeout_s:g} s and was stopped", False
    except Exception as exc:  # a tool's bug is the model's feedback, not the run's crash
        return f"error: {type(exc).__name__}: {exc}", False
    return (out if isinstance(out, str) else json.dumps(out, default=str)), True


class ToolBox:
    """The tools of one trajectory, the call format, and the limits: runs the calls of a model turn."""

    def __init__(self, tools: Sequence[Callable[..., Any]], fmt: Any, timeout_s: float = 10.0, max_chars: int = 400):
        self.tools = {tool_name(t): t for t in tools}
        self.format = fmt
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.calls = 0  # over the trajectory
        self.valid = 0

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(t) for t in self.tools.values()]

    def instructions(self) -> str:
        """The system-prompt text that offers the tools when the chat template cannot."""
        return self.format.instructions(self.schemas())

    def run(self, model_turn: str) -> ToolTurn:
        """Execute every tool call in `model_turn`: one tool message per call (none: no calls)."""
        messages, valid = [], 0
        calls = self.format.parse(model_turn)
        for call in calls:
            fn = self.tools.get(call.name)
            if call.error:
                text, ok = f"error: {call.error}", False
            elif fn is None:
                text, ok = f"error: unknown tool {call.name!r}; tools: {', '.join(self.tools) or 'none'}", False
            else:
                text, ok = call_tool(fn, call.arguments, self.timeout_s)
            valid += int(ok)
            messages.append({"role": "tool", "name": call.name or "?", "content": truncate(text, self.max_chars)})
        self.calls += len(calls)
        self.valid += valid
        return ToolTurn(messages, len(calls), valid)
