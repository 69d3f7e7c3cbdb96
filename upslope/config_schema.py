"""Walking the config's schema (pydantic models): an error's location as a dotted key, the options
valid at a location, and the table of every option with its default and help."""
from __future__ import annotations

from types import UnionType
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from upslope.errors import did_you_mean


def describe(exc: ValidationError, root: type[BaseModel]) -> str:
    """The first error of `exc` as `key: what was expected (got value)`; the alternatives of an option
    that takes one of several types (e.g. an integer or 'auto') are all named."""
    errors = exc.errors()
    err = errors[0]
    loc = [str(x) for x in err["loc"]]
    key = dotted(root, err["loc"])
    if err["type"] == "extra_forbidden":
        valid = fields_at(root, loc[:-1])
        hint = did_you_mean(loc[-1], valid, shown=lambda near: dotted(root, (*err["loc"][:-1], near)), paren=False)
        return f"unknown key '{key}'{hint} (valid here: {', '.join(valid)})"
    given = err.get("input")
    msgs = dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in errors if dotted(root, e["loc"]) == key)
    msg = " or ".join(msgs)
    shown = "" if isinstance(given, dict) or "(got " in msg else f" (got {given!r})"
    if not key:
        return msg
    return f"{key}: {msg}{shown}"


def dotted(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a dotted key (`reward[0].weight`), without the tags pydantic adds for
    the member of a union (`train.micro_batch_tokens`, not `train.micro_batch_tokens.constrained-int`)."""
    out, model, union = "", root, False
    for part in loc:
        if isinstance(part, int):  # a list item, written as plugin options' errors write it
            out += f"[{part}]"
            continue
        field = model.model_fields.get(part) if model is not None else None
        if union and field is None:  # the tag of the union member that failed
            union = False
            continue
        out += f".{part}" if out else str(part)
        ann = field.annotation if field is not None else None
        model, union = model_in(ann), is_union(ann)
    return out


def is_union(ann: Any) -> bool:
    """An annotation of two or more types besides None (pydantic tags each member in error locations)."""
    args = [a for a in getattr(ann, "__args__", ()) or () if a is not type(None)]
    return (getattr(ann, "__origin__", None) is Union or type(ann) is UnionType) and len(args) > 1


def fields_at(root: type[BaseModel], loc: list[str]) -> list[str]:
    """The option names of the section at `loc` (for an unknown key's suggestions)."""
    model: Any = root
    for part in loc:
        if part.isdigit():
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        model = model_in(ann)
        if model is None:
            return []
    return list(model.model_fields)


def model_in(ann: Any) -> Any:
    """The config section class inside an annotation (`X | None`, `list[X]`), if any."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        m = model_in(arg)
        if m is not None:
            return m
    return None


def option_rows(model: type[BaseModel], prefix: str = "", leaves: tuple[type, ...] = ()) -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every option of `model`; a section of a `leaves` class is one option."""
    rows = []
    for name, field in model.model_fields.items():
        sub = model_in(field.annotation)
        key = f"{prefix}{name}"
        if sub is not None and sub not in leaves and not _is_list(field.annotation):
            if field.default is None:  # an optional section (off, or derived, until set): its own help first
                rows.append((key, "null", field.description or ""))
            rows.extend(option_rows(sub, key + ".", leaves))
        else:
            default = field.default if field.default is not None else "null"
            if isinstance(default, BaseModel):
                default = default.model_dump()
            rows.append((key, repr(default) if not isinstance(default, str) else default, field.description or ""))
    return rows


def _is_list(ann: Any) -> bool:
    return getattr(ann, "__origin__", None) is list
