"""Tool-call formats (registry `tool_format`): how the model writes a call, parsed back into
ToolCalls, and the system-prompt text that teaches the format when the chat template has no
`tools=` support. A format is a class with `parse(text)` and `instructions(schemas)`."""
from __future__ import annotations

import json
import re
from typing import Any

from upslope.agents.tools import ToolCall
from upslope.registry import TOOL_FORMATS

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def _tool_list(schemas: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(s["function"]) for s in schemas)


@TOOL_FORMATS.register("hermes")
class Hermes:
    """JSON in tool_call tags (Hermes / Qwen style): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

    def parse(self, text: str) -> list[ToolCall]:
        """Every tagged call in `text`, in order (an unclosed last tag counts: the turn ended inside it)."""
        out = []
        for body in _TAGGED.findall(text):
            try:
                obj = json.loads(body.strip())
            except json.JSONDecodeError as exc:
                out.append(ToolCall("", error=f"the tool call is not valid JSON ({exc.msg})"))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                out.append(ToolCall("", error='a tool call is a JSON object {"name": ..., "arguments": {...}}'))
                continue
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):  # some models encode the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            if not isinstance(args, dict):
                out.append(ToolCall(obj["name"], error="the tool call's arguments must be a JSON object"))
                continue
            out.append(ToolCall(obj["name"], args))
        return out

    def instructions(self, schemas: list[dict[str, Any]]) -> str:
        first = schemas[0]["function"] if schemas else {"name": "tool", "parameters": {"properties": {}}}
        example = {"name": first["name"], "arguments": {k: "..." for k in first["parameters"]["properties"]}}
        return ("You can call these tools:\n" + _tool_list(schemas) + "\nTo call a tool, write "
                f"<tool_call>{json.dumps(example)}</tool_call> and stop; its result comes back in the next "
                "message. When you know the final answer, give it without a tool call.")


@TOOL_FORMATS.register("python_block")
class PythonBlock:
    """A fenced ```python block is a call of the `python` tool with the block as its code.

    tool: the tool each block is passed to (its one argument is `code`)
    """

    def __init__(self, *, tool: str = "python"):
        self.tool = tool

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall(self.tool, {"code": body}) for body in _FENCED.findall(text)]

    def instructions(self, schemas: list[dict[str, Any]]) -> str:
        return ("You can run Python: write a fenced block\n```python\nprint(12 * 34)\n```\nand stop; what it "
                "prints comes back in the next message. When you know the final answer, give it without code.")
