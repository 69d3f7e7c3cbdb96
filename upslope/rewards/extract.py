"""Answer extraction from free text: the number a completion commits to."""
from __future__ import annotations

import re

_INT = re.compile(r"(?<![\d.])-?\d{1,3}(?:,\d{3})+(?![\d]|\.\d)|(?<![\d.])-?\d+(?![\d]|\.\d)")
_NUM = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


def _to_int(text: str) -> int:
    return int(text.replace(",", ""))


def integers(text: str) -> list[int]:
    """All integers in `text` (thousands separators allowed), in order."""
    return [_to_int(m.group()) for m in _INT.finditer(text)]


def boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, with nested braces."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth, j = 0, i
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
        j += 1
    return None


def extract_integer(text: str, strategy: str = "first") -> int | None:
    """The integer a completion answers with.

    first: the first integer in the text; last: the last one; after_equals: the first
    integer after the last '='; boxed: the integer inside the last \\boxed{}; after_hashes:
    the integer after '####' (GSM8K style)."""
    if strategy == "first":
        found = integers(text)
        return found[0] if found else None
    if strategy == "last":
        found = integers(text)
        return found[-1] if found else None
    if strategy == "after_equals":
        if "=" not in text:
            return None
        found = integers(text.rsplit("=", 1)[1])
        return found[0] if found else None
    if strategy == "boxed":
        inner = boxed(text)
        found = integers(inner) if inner is not None else []
        return found[0] if len(found) == 1 else None
    if strategy == "after_hashes":
        if "####" not in text:
            return None
        found = integers(text.rsplit("####", 1)[1])
        return found[0] if found else None
    raise ValueError(f"unknown extraction strategy '{strategy}' (first, last, after_equals, boxed, after_hashes)")


STRATEGIES = ("first", "last", "after_equals", "boxed", "after_hashes")
