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


_OPERATORS = "+-*/^\u00d7\u00f7"  # + - * / ^ and the multiplication and division signs


def _is_operand(text: str, start: int, end: int) -> bool:
    """True when the number text[start:end] stands beside an arithmetic operator ("8 * 1", "8x1")."""
    before, after = text[:start].rstrip(), text[end:].lstrip()
    if before and (before[-1] in _OPERATORS or (before[-1] == "x" and before[:-1].rstrip()[-1:].isdigit())):
        return True
    return bool(after) and (after[0] in _OPERATORS or (after[0] == "x" and after[1:].lstrip()[:1].isdigit()))


def first_result(text: str) -> int | None:
    """The first integer that is not an operand of an arithmetic expression: echoing the question
    ("To find 8 * 1,") commits to nothing, while "9 * 6 = 54" and "54" commit to 54."""
    for m in _INT.finditer(text):
        if not _is_operand(text, m.start(), m.end()):
            return _to_int(m.group())
    return None


def extract_integer(text: str, strategy: str = "first") -> int | None:
    """The integer a completion answers with.

    first: the first integer in the text; first_result: the first that is not an operand of an
    expression (an echo of the question scores nothing); last: the last one; after_equals: the
    first integer after the last '='; boxed: the integer inside the last \\boxed{}; after_hashes:
    the integer after '####' (GSM8K style)."""
    if strategy == "first":
        found = integers(text)
        return found[0] if found else None
    if strategy == "first_result":
        return first_result(text)
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
    raise ValueError(f"unknown extraction strategy '{strategy}' (first, first_result, last, after_equals, boxed, after_hashes)")


STRATEGIES = ("first", "first_result", "last", "after_equals", "boxed", "after_hashes")
