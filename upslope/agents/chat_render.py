"""The chat template as a recorder of agent calls needs it: a conversation rendered to text (the tools
offered through `tools=` when the template takes them, else as the tool format's instructions in the
system message), and the text that continues a conversation already in token ids: the template's
closing of the last assistant turn, the new messages and the next turn's header, rendered without
re-rendering anything before them."""
from __future__ import annotations

import threading
from typing import Any, Sequence

Message = dict[str, Any]

# A fixed conversation the new messages are rendered after: the template's text for it is a prefix of
# its text for it plus the new messages, so the difference is the new messages alone.
_PLACEHOLDER: list[Message] = [{"role": "user", "content": "u"},
                               {"role": "assistant", "content": "assistant-placeholder"}]


class TemplateAppendError(ValueError):
    """The chat template renders earlier turns differently once messages follow them, so the new
    messages cannot be rendered on their own."""


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders `tools=` (its output changes when tools are given)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    msgs = [{"role": "user", "content": "u"}]
    probe = [{"type": "function", "function": {"name": "probe_tool_name", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        with_tools = tokenizer.apply_chat_template(msgs, tools=probe, tokenize=False)
    except Exception:
        return False
    return "probe_tool_name" in with_tools


def with_system_text(messages: Sequence[Message], text: str) -> list[Message]:
    """`messages` with `text` added to the system message (a new first message when there is none)."""
    messages = list(messages)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{text}"}] + messages[1:]
    return [{"role": "system", "content": text}] + messages


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template. `instructions(tools)` gives the text
    that offers tools when the template cannot (the tool format's instructions). Safe to share between
    threads: calls into the tokenizer are serialised (a fast tokenizer used from two threads at once
    can fail)."""

    def __init__(self, tokenizer: Any, instructions: Any = None):
        self.tokenizer = tokenizer
        self._lock = threading.RLock()
        self.instructions = instructions
        self.takes_tools = template_takes_tools(tokenizer)
        base = tokenizer.apply_chat_template(_PLACEHOLDER, tokenize=False)
        content = _PLACEHOLDER[-1]["content"]
        self._base = base
        self.closing = base[base.rindex(content) + len(content):]  # after an assistant turn's content (ChatML: "<|im_end|>\n")

    def text(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None, *,
             prefill: bool = False) -> str:
        """The conversation as the model reads it before its next turn: the template with the generation
        prompt, or, with `prefill`, the last message (an assistant turn) left open for the model to go on."""
        messages = list(messages)
        kwargs: dict[str, Any] = {}
        if tools and self.takes_tools:
            kwargs["tools"] = tools
        elif tools and self.instructions is not None:
            messages = with_system_text(messages, self.instructions(tools))
        with self._lock:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not prefill,
                                                      continue_final_message=prefill, **kwargs)

    def continuation(self, messages: Sequence[Message], stop_text: str | None, *, prefill: bool = False) -> str:
        """The text after a model turn that ends the conversation so far: the rest of the template's closing
        of that turn (`stop_text`: the end token the model wrote, which the closing then continues;
        None: the turn was cut, so the whole closing), the new `messages` and the next turn's header (or,
        with `prefill`, the last new message, an assistant turn, left open)."""
        with self._lock:
            full = self.tokenizer.apply_chat_template(_PLACEHOLDER + list(messages), tokenize=False,
                                                      add_generation_prompt=not prefill, continue_final_message=prefill)
        if not full.startswith(self._base):
            raise TemplateAppendError("the chat template renders earlier turns differently once messages follow them")
        closing = self.closing
        if stop_text is not None:
            closing = closing[len(stop_text):] if stop_text and closing.startswith(stop_text) else ""
        return closing + full[len(self._base):]

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text, special tokens kept (so that decoded ids compare with rendered text)."""
        with self._lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def reply_text(self, ids: Sequence[int]) -> str:
        """A reply's text as the agent gets it (special tokens skipped)."""
        with self._lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
