"""The record every data source and task produces."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Example:
    """One prompt: `prompt` is plain text (wrapped as a user turn) or a list of chat
    messages; `answer` is the reference a reward compares against; `meta` passes any other
    fields (tests, entry point, source line) through to the rewards. `prefill` is text the
    assistant's reply starts with: part of the prompt (never trained on), continued by the model."""

    prompt: str | list[dict[str, str]]
    answer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    prefill: str = ""

    def messages(self, system_prompt: str | None = None) -> list[dict[str, str]]:
        msgs = [{"role": "user", "content": self.prompt}] if isinstance(self.prompt, str) else list(self.prompt)
        if system_prompt and not any(m.get("role") == "system" for m in msgs):
            msgs = [{"role": "system", "content": system_prompt}] + msgs
        return msgs
