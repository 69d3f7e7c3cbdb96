"""A python-tool agent written as an ordinary OpenAI-client program: it asks the model, runs the Python
the model writes, sends back what it printed, and scores the final answer itself.

It knows nothing of training: `upslope train recipes/openai_agent_python.yaml` hands it the base URL of
an OpenAI-compatible endpoint over the policy and a task row ({"prompt": ..., "answer": ...}), and
trains on the token ids of its calls. The same function runs against any OpenAI-compatible server.

The program mirrors upslope's built-in python-tool environment (recipes/agent_python.yaml): the same
system text, fenced ```python blocks run in upslope's sandbox with a 5 s limit, output cut to 400
characters, the turn after a tool result started with "The answer is" (a prefilled assistant turn, the
`continue_final_message` extension vLLM's server has too), at most 3 model turns, reward 1 for the right
last integer and 0.2 for code that ran."""
from __future__ import annotations

import re
from typing import Any

from openai import BadRequestError, OpenAI

SYSTEM = ("You can run Python: write a fenced block\n```python\nprint(12 * 34)\n```\nand stop; what it "
          "prints comes back in the next message. When you know the final answer, give it without code.")
FENCED = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|$)", re.DOTALL)
INTEGER = re.compile(r"-?\d[\d,]*")
MAX_TURNS = 3
OUTPUT_CHARS = 400


def run_python(code: str) -> tuple[str, bool]:
    """Run `code` in upslope's sandbox: (what it printed or the error, whether it ran)."""
    from upslope.agents.builtin_tools import python

    out = python(code, timeout_s=5.0)
    if len(out) > OUTPUT_CHARS:  # head and tail, as the built-in tool box cuts results
        head, tail = OUTPUT_CHARS * 2 // 3, OUTPUT_CHARS - OUTPUT_CHARS * 2 // 3
        out = f"{out[:head]}\n[... {len(out) - head - tail} characters cut ...]\n{out[len(out) - tail:]}"
    return out, not out.startswith("error:")


def last_integer(text: str) -> int | None:
    found = INTEGER.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def agent(base_url: str, row: dict[str, Any]) -> dict[str, float]:
    """One trajectory: the model's turns, the code they contain run, until a turn without code answers."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["prompt"]}]
    ran = False
    prefill = ""
    for _ in range(MAX_TURNS):
        extra = {}
        if prefill:
            messages.append({"role": "assistant", "content": prefill})
            extra = {"continue_final_message": True}
        try:
            reply = client.chat.completions.create(model="policy", messages=messages, extra_body=extra)
        except BadRequestError:  # out of turns or tokens: the trajectory ends unanswered
            break
        text = reply.choices[0].message.content or ""
        if prefill:
            messages[-1]["content"] = prefill + text
        else:
            messages.append({"role": "assistant", "content": text})
        blocks = FENCED.findall(text)
        if not blocks:
            right = last_integer(text) == int(row["answer"])
            return {"correct": float(right), "tool": 0.2 * ran}
        for code in blocks:
            out, ok = run_python(code)
            ran = ran or ok
            messages.append({"role": "tool", "content": out})
        prefill = "The answer is"
    return {"correct": 0.0, "tool": 0.2 * ran}
