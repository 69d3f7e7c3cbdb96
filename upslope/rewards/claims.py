"""The `claims` reward: a reply cut into claims (sentences, lines), each checkable claim verified, and
each verdict placed on the token where its claim ends (+1/n supported, -1/n unsupported, n the reply's
checkable claims). BALTO's token labels: the advantage `balto` reads the sign of each placed part as the
label of the tokens of its claim."""
from __future__ import annotations

import ast
import operator
import re
from typing import Any, Literal

from upslope.bounds import Regex
from upslope.registry import REWARDS
from upslope.rewards.extract import integers
from upslope.rewards.placement import PlacedReward

_EQUATION = re.compile(r"(?<![\d.])(-?\d+(?:\s*[-+*/x\u00d7\u00f7]\s*-?\d+)+)\s*=\s*(-?\d+)(?![\d.]\d)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expr: str) -> float | None:
    """The value of an integer expression with + - * / (x and the multiplication and division signs
    read as * and /), or None when it is anything else or divides by zero."""
    text = expr.replace("\u00d7", "*").replace("x", "*").replace("\u00f7", "/")

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(expr)

    try:
        return walk(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def verdict(claim: str, check: str, reference: str) -> bool | None:
    """Is a claim supported (True), unsupported (False) or not checkable (None)? `arithmetic`: a claim with
    equations `expression = integer` is supported when every one holds; `context`: a claim with integers is
    supported when each of them occurs in the reference text."""
    if check == "arithmetic":
        found = [(evaluate(lhs), float(rhs)) for lhs, rhs in _EQUATION.findall(claim)]
        return all(v is not None and abs(v - rhs) < 1e-9 for v, rhs in found) if found else None
    nums = integers(claim)
    return set(nums) <= set(integers(reference)) if nums else None


def claim_spans(text: str, split: str) -> list[tuple[int, int]]:
    """(start, end) of each non-blank claim: the text cut after every match of `split` (the delimiter stays
    with the claim before it)."""
    spans, start = [], 0
    for m in re.finditer(split, text):
        if text[start:m.end()].strip():
            spans.append((start, m.end()))
        start = m.end()
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


def claims_place_tokens(options: dict[str, Any]) -> bool:
    """The registry trait `places_tokens`: every claim's verdict is placed where the claim ends."""
    return True


@REWARDS.register("claims", places_tokens=claims_place_tokens)
def claims(completion: str, answer: Any, meta: dict, *, split: Regex = r"[.;!?\n]",
           check: Literal["arithmetic", "context"] = "arithmetic", context_field: str = "context") -> Any:
    """The reply's checkable claims verified; +1/n (supported) or -1/n (not) placed where each claim ends.

    split: where one claim ends (a regular expression; the match stays with the claim before it)
    check: arithmetic (each equation 'expression = integer' is evaluated) or context (each integer must occur in the reference text)
    context_field: check context: the meta field holding the reference text the claims are grounded in

    BALTO (Li et al. 2026) extracts checkable factual claims, verifies them against the reference context
    and projects the claim-level judgments onto token labels. Here claims are the reply's sentences and
    lines, verified by a rule instead of an LLM extractor and verifier: an equation is checked by
    evaluating it, a number by finding it in the reference. As a sequence reward this is (supported -
    unsupported) / checkable, 0 for a reply with no checkable claim; placed on tokens (its parts) it gives
    the advantage `balto` each claim's label over the tokens of the claim.
    """
    reference = ""
    if check == "context":
        if context_field not in meta:
            raise ValueError(f"reward 'claims': check context needs the meta field {context_field!r} "
                             f"(fields: {sorted(meta)})")
        reference = str(meta[context_field])
    judged = [(end, verdict(completion[start:end], check, reference)) for start, end in claim_spans(completion, split)]
    judged = [(end, ok) for end, ok in judged if ok is not None]
    if not judged:
        return 0.0
    return PlacedReward(tuple((end, (1.0 if ok else -1.0) / len(judged)) for end, ok in judged))
