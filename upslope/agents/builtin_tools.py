"""The built-in tools: `calculator` (arithmetic on a parsed expression tree, never eval) and
`python` (a program run in upslope's sandbox, its output cut). Keyword-only parameters are a
tool's options (agent.tools: [{name: python, options: {timeout_s: 2}}]), not the model's."""
from __future__ import annotations

import ast
import functools
import operator
from typing import Any, Callable

from upslope.bounds import Positive, PositiveCount
from upslope.registry import TOOLS

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST, max_digits: int) -> int | float:
    """Value of an arithmetic expression tree: numbers, + - * / // % ** and parentheses only."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, max_digits)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, max_digits))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _evaluate(node.left, max_digits), _evaluate(node.right, max_digits)
        if isinstance(node.op, ast.Pow) and abs(b) * len(str(int(abs(a)) or 1)) > max_digits:
            raise ValueError(f"the result would have more than {max_digits} digits")
        out = _BINARY[type(node.op)](a, b)
        if isinstance(out, int) and len(str(abs(out))) > max_digits:
            raise ValueError(f"the result has more than {max_digits} digits")
        return out
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {ast.unparse(node)!r}")


@TOOLS.register("calculator")
def calculator(expression: str, *, max_digits: PositiveCount = 100) -> str:
    """Evaluate an arithmetic expression exactly, e.g. 123 * 456 + 7.

    expression: numbers with + - * / // % ** and parentheses
    max_digits: longest integer result allowed (bounds the work a call can ask for)
    """
    try:
        tree = ast.parse(expression.strip().replace("^", "**").replace("×", "*"), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree, max_digits)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value)


@functools.lru_cache(maxsize=8)
def _sandbox(timeout_s: float, memory_mb: int, allow_weak: bool) -> Any:
    """One sandbox per limits (it is safe to share between threads)."""
    from upslope.sandbox import Sandbox, SandboxConfig

    return Sandbox(SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=1 << 16,
                                 allow_weak=allow_weak))


@TOOLS.register("python")
def python(code: str, *, timeout_s: Positive = 5.0, memory_mb: PositiveCount = 512, allow_weak: bool = False) -> str:
    """Run a Python program in the sandbox and return what it printed (stdout, then stderr).

    code: the program; print what you want to see
    timeout_s: wall-clock limit of the program in the sandbox
    memory_mb: address-space limit of the program
    allow_weak: without bubblewrap, run with rlimits only instead of refusing
    """
    from upslope.sandbox import Job, Status

    res = _sandbox(timeout_s, memory_mb, allow_weak).run(Job(code=code))
    out = res.stdout + (("\n" if res.stdout else "") + res.stderr if res.stderr else "")
    if res.status is Status.OK:
        return out or "(no output)"
    if res.status is Status.REFUSED:
        return f"error: the sandbox refused to run the code ({res.error})"
    if res.status is Status.TIMEOUT:
        return f"error: the program ran past its {timeout_s:g} s limit and was killed\n{out}".rstrip()
    return f"error: the program ended with status {res.status}\n{out}".rstrip()
