"""Tools: schemas from signatures, the calculator, the call formats, and every failure (bad JSON,
unknown tool, bad arguments, an exception, a timeout, long output) coming back as a tool message."""
from __future__ import annotations

import time

import pytest

from upslope.agents import ToolBox, call_tool, tool_schema
from upslope.agents.builtin_tools import calculator
from upslope.agents.formats import Hermes, PythonBlock
from upslope.registry import TOOLS


def lookup(city: str, days: int = 1, units: list[str] | None = None, *, api_key: str = "") -> str:
    """Weather forecast for a city.

    city: the city's name
    days: how many days ahead
    api_key: configuration, not shown to the model
    """
    return f"{city}: sunny for {days} days"


def test_schema_comes_from_the_signature_and_docstring():
    assert tool_schema(lookup) == {"type": "function", "function": {
        "name": "lookup", "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "days": {"type": "integer", "description": "how many days ahead"},
            "units": {"type": "array", "items": {"type": "string"}}}}}}


@pytest.mark.parametrize("expr, value", [("123 * 456", "56088"), ("2 ** 10 - (3 + 4) * 2", "1010"),
                                         ("7 / 2", "3.5"), ("-8 // 3", "-3"), ("10 % 4", "2"), ("6^2", "36"),
                                         ("987654321 * 123456789", str(987654321 * 123456789))])
def test_calculator_is_exact(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize("expr, message", [
    ("__import__('os').system('true')", "only numbers"), ("open('/etc/passwd')", "only numbers"),
    ("x + 1", "only numbers"), ("9 ** 9 ** 9", "digits"), ("1 +", "not an arithmetic expression"),
    ("'a' * 3", "only numbers")])
def test_calculator_refuses_anything_but_arithmetic(expr, message):
    """No names, calls, strings or giant powers: a ValueError, which a call turns into a tool message."""
    with pytest.raises(ValueError, match=message):
        calculator(expr)
    text, ok = call_tool(calculator, {"expression": expr}, timeout_s=2)
    assert not ok and text.startswith("error: ") and message in text


def test_hermes_parses_tagged_json_calls():
    turn = ('First <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> then '
            '<tool_call>{"name": "lookup", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call> and '
            '<tool_call>{"name": broken}</tool_call> <tool_call>[1, 2]</tool_call>')
    calls = Hermes().parse(turn)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("calculator", {"expression": "1+2"}),
                                                          ("lookup", {"city": "Oslo"})]
    assert "not valid JSON" in calls[2].error and "JSON object" in calls[3].error
    assert Hermes().parse("no call here, 12 * 34 = 408") == []
    unclosed = Hermes().parse('<tool_call>{"name": "calculator", "arguments": {"expression": "5"}}')
    assert unclosed[0].arguments == {"expression": "5"}


def test_python_block_is_a_call_of_the_python_tool():
    calls = PythonBlock().parse("Let me compute.\n```python\nprint(12 * 34)\n```\nDone.")
    assert [(c.name, c.arguments) for c in calls] == [("python", {"code": "print(12 * 34)\n"})]
    assert PythonBlock().parse("```\nnot python\n```") == []


def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "woke up"


def failing(x: int) -> str:
    """Always fails."""
    return str(1 // (x - x))


def chatty() -> str:
    """Too much output."""
    return "y" * 5000


def test_every_failure_is_a_tool_message_not_a_crash():
    box = ToolBox([calculator, slow, failing, chatty], Hermes(), timeout_s=0.3, max_chars=100)
    call = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'.format
    turn = "".join([call("calculator", '{"expression": "6 * 7"}'), call("slow", '{"seconds": 3}'),
                    call("failing", '{"x": 2}'), call("chatty", "{}"), call("nope", "{}"),
                    call("calculator", '{"expr": "1"}'), call("failing", '{"x": "two"}'), "<tool_call>{bad"])
    start = time.monotonic()
    out = box.run(turn)
    assert time.monotonic() - start < 2.0  # the slow tool was not waited for
    texts = [m["content"] for m in out.messages]
    assert all(m["role"] == "tool" for m in out.messages)
    assert texts[0] == "42"
    assert "longer than 0.3 s" in texts[1]
    assert "ZeroDivisionError" in texts[2]
    assert texts[3] == "y" * 66 + "\n[... 4900 characters cut ...]\n" + "y" * 34
    assert "unknown tool 'nope'" in texts[4]
    assert "unknown argument 'expr'" in texts[5]
    assert "argument 'x'" in texts[6] and "integer" in texts[6]
    assert "not valid JSON" in texts[7]
    assert (out.calls, out.valid) == (8, 2) and (box.calls, box.valid) == (8, 2)


def test_tool_options_are_keyword_only_and_configurable():
    """Keyword-only parameters of a registered tool are its options (bound from agent.tools), not arguments."""
    bound = TOOLS.bind("calculator", {"max_digits": 3})
    assert list(tool_schema(bound)["function"]["parameters"]["properties"]) == ["expression"]
    text, ok = call_tool(bound, {"expression": "999 * 999"}, timeout_s=2)
    assert not ok and "3 digits" in text
