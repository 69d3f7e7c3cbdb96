"""Token-exact recording of one agent's chat calls, as training rows.

An agent program sends whole conversations (OpenAI chat messages); the policy must be trained on the
token ids it sampled from, not on a re-tokenisation of the text the agent sends back. So each call is
matched against the rows recorded so far: when its messages extend a row's conversation (the replies
in it exactly as they were returned), the prompt is that row's ids continued by the new messages alone
(rendered by the chat template, environment tokens, loss mask 0) and the reply's tokens are appended
with the sampler's log-probs (loss mask 1): one row for the whole conversation. A call that extends no
row (the agent dropped, edited or summarised its context, or started a sub-conversation) starts a new
row from the template's rendering of its messages.

The recorder also checks that the template would show the model its history as it was sampled: the
template's rendering of the conversation, with every recorded reply as the text the model wrote, must
decode to the same text as the recorded ids. Templates that strip earlier `<think>` blocks, trim
replies or render tool calls in their own syntax do not; that is a *template rewrite*. With `keep`
(default) the row continues token-exact (the model is trained on exactly what it saw, which differs
from what the template shows it at inference); with `follow` the call starts a new row from the
template's rendering (the model sees at training what it sees at inference, in more rows)."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from upslope.agents.chat_render import ChatRenderer, Message, TemplateAppendError
from upslope.engine import Completion

RewritePolicy = Literal["keep", "follow"]


class LimitReached(Exception):
    """A call the trajectory's limits do not allow (turns, tokens, prompt length): the agent gets it as an
    error, the trajectory's row ends there."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def normalize(message: Message) -> Message:
    """A chat message reduced to what decides the conversation: role, text content (parts joined,
    None as ""), and for assistant turns the tool calls as (name, parsed arguments). Ids the client
    echoes back (tool_call_id, a call's id) do not change what the model read."""
    role = str(message.get("role", ""))
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    out: Message = {"role": role, "content": content or ""}
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        norm = []
        for c in calls:
            fn = c.get("function", c) if isinstance(c, dict) else {}
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            norm.append({"name": fn.get("name"), "arguments": args})
        out["tool_calls"] = norm
    return out


def template_message(message: Message) -> Message:
    """A message as chat templates take it (content a string; tool calls with dict arguments)."""
    norm = normalize(message)
    out: Message = {"role": norm["role"], "content": norm["content"]}
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            out[key] = message[key]
    if "tool_calls" in norm:
        out["tool_calls"] = [{"type": "function", "function": c} for c in norm["tool_calls"]]
    return out


@dataclass
class Row:
    """One training row in the making: the prompt of its first call, then model turns (loss mask 1,
    sampler log-probs) and what came between them (loss mask 0, log-prob 0)."""

    prompt: list[int]
    tools_key: str
    messages: list[Message] = field(default_factory=list)  # normalised, ending with the last reply
    written: dict[int, str] = field(default_factory=dict)  # message index -> the text the model wrote there
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    stop_text: str | None = None  # the end token that closed the last reply ("": none seen; None: cut)
    replies: int = 0
    truncated: bool = False  # ran out of its token budget
    last_reply: str = ""

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None, trained: bool) -> None:
        self.ids += list(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(trained)] * len(ids)


@dataclass
class Call:
    """One prepared call: the engine's prompt, the row it continues (None: a new row) and what is added
    to that row before the reply."""

    prompt: list[int]
    messages: list[Message]  # the request's messages, normalised (the prefill, if any, last)
    tools_key: str
    row: Row | None
    base: int  # the row's length when prepared: a concurrent call that grew it first makes this one a new row
    added: list[int]
    prefill: str
    max_tokens: int  # most tokens the reply may have
    budget_cut: bool  # a reply of max_tokens tokens ends the row (its token budget, not a per-turn limit)


@dataclass
class Counts:
    calls: int = 0
    template_rewrites: int = 0  # calls whose history the template renders differently from the recorded ids
    context_rewrites: int = 0  # calls that extended no recorded row (after the first)
    branches: int = 0  # calls that continued a row another call had grown meanwhile
    limit_errors: int = 0


class Recorder:
    """The rows of one trajectory (one agent run on one task row). Thread-safe: an agent may make
    calls concurrently; each continues the row it extends, or starts its own.

    max_calls: most model calls; max_tokens: most tokens of a row after its prompt (model and environment
    together); max_turn_tokens: most tokens of one reply (None: what is left); max_prompt_tokens: longest
    prompt of a new row."""

    def __init__(self, renderer: ChatRenderer, *, max_calls: int, max_tokens: int, max_turn_tokens: int | None = None,
                 max_prompt_tokens: int | None = None, on_rewrite: RewritePolicy = "keep"):
        self.renderer = renderer
        self.max_calls, self.max_tokens, self.max_turn_tokens = max_calls, max_tokens, max_turn_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.on_rewrite = on_rewrite
        self.rows: list[Row] = []
        self.counts = Counts()
        self.rewrite_example: str = ""  # where the first rewrite showed (for the one-line note)
        self._lock = threading.Lock()
        self._started = 0  # calls prepared (limit on calls counts them at once, so concurrent calls obey it too)

    def prepare(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None,
                prefill: bool = False, max_tokens: int | None = None) -> Call:
        """The prompt ids of a call. `prefill`: the last message is an assistant turn the reply continues.
        Raises LimitReached when the trajectory's limits forbid the call."""
        if not messages:
            raise ValueError("messages is empty")
        norm = [normalize(m) for m in messages]
        if prefill and norm[-1]["role"] != "assistant":
            raise ValueError("continue_final_message needs the last message to be an assistant turn")
        prefill_text = norm[-1]["content"] if prefill else ""
        prefill = prefill and bool(prefill_text)
        tools_key = json.dumps(tools or [], sort_keys=True)
        with self._lock:
            if self._started >= self.max_calls:
                self.counts.limit_errors += 1
                raise LimitReached(f"the trajectory has made its {self.max_calls} model calls (agent.max_turns)",
                                   "turn_limit")
            self._started += 1
            call = self._continue(norm, messages, tools, tools_key, prefill, prefill_text)
        if call is None:
            text = self.renderer.text([template_message(m) for m in messages], tools, prefill=prefill)
            ids = self.renderer.encode(text)
            if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
                with self._lock:
                    self.counts.limit_errors += 1
                raise LimitReached(f"the conversation has {len(ids)} tokens, over the context length of "
                                   f"{self.max_prompt_tokens} for a prompt (rollout.max_prompt_tokens)",
                                   "context_length_exceeded")
            call = Call(ids, norm, tools_key, None, 0, [], prefill_text, self.max_tokens, True)
        return self._bounded(call, max_tokens)

    def _bounded(self, call: Call, requested: int | None) -> Call:
        """The call's reply limit: what is left of the row's budget, the per-turn limit, the request's."""
        used = (len(call.row.ids) if call.row is not None else 0) + len(call.added)
        left = self.max_tokens - used
        if left <= 0:
            with self._lock:
                self.counts.limit_errors += 1
                if call.row is not None:
                    call.row.truncated = True
            raise LimitReached(f"the conversation is out of tokens: {used} of the trajectory's context length of "
                               f"{self.max_tokens} after the prompt (rollout.max_new_tokens)", "context_length_exceeded")
        limits = [left] + [x for x in (self.max_turn_tokens, requested) if x]
        call.max_tokens = min(limits)
        call.budget_cut = call.max_tokens == left
        return call

    def _continue(self, norm: list[Message], messages: Sequence[Message], tools: list[dict[str, Any]] | None,
                  tools_key: str, prefill: bool, prefill_text: str) -> Call | None:
        """The call as a continuation of the longest row whose conversation its messages extend (None: none does)."""
        best = None
        for row in self.rows:
            k = len(row.messages)
            if (row.tools_key == tools_key and k < len(norm) and norm[:k] == row.messages
                    and (best is None or k > len(best.messages))):
                best = row
        if best is None:
            if self.rows:
                self.counts.context_rewrites += 1
            return None
        if best.truncated:  # the conversation it extends is out of tokens: the trajectory ends there
            self.counts.limit_errors += 1
            raise LimitReached(f"the conversation is out of tokens: {len(best.ids)} of the trajectory's context length of "
                               f"{self.max_tokens} after the prompt (rollout.max_new_tokens)", "context_length_exceeded")
        new = [template_message(m) for m in messages[len(best.messages):]]
        try:
            text = self.renderer.continuation(new, best.stop_text, prefill=prefill)
        except TemplateAppendError:
            self.counts.template_rewrites += 1
            self.rewrite_example = self.rewrite_example or "the template does not render new messages by appending"
            return None
        added = self.renderer.encode(text)
        prompt = best.prompt + best.ids + added
        if self._rewritten(best, messages, tools, prompt, prefill):
            self.counts.template_rewrites += 1
            if self.on_rewrite == "follow":
                return None
        return Call(prompt, norm, tools_key, best, len(best.ids), added, prefill_text, 0, True)

    def _rewritten(self, row: Row, messages: Sequence[Message], tools: list[dict[str, Any]] | None,
                   prompt: list[int], prefill: bool) -> bool:
        """Does the template render this conversation, with each recorded reply as the model wrote it,
        differently from the recorded ids? (Both sides decoded, so only text differences count.)"""
        shown = [template_message(m) for m in messages]
        for i, text in row.written.items():
            shown[i] = {"role": "assistant", "content": text}
        fresh = self.renderer.text(shown, tools, prefill=prefill)
        recorded = self.renderer.decode(prompt)
        if self.renderer.decode(self.renderer.encode(fresh)) == recorded:
            return False
        if not self.rewrite_example:
            at = next((i for i, (a, b) in enumerate(zip(fresh, recorded)) if a != b), min(len(fresh), len(recorded)))
            self.rewrite_example = (f"recorded {recorded[max(0, at - 30):at + 30]!r}, template "
                                    f"{fresh[max(0, at - 30):at + 30]!r}")
        return True

    def record(self, call: Call, completion: Completion, stop_ids: Sequence[int], reply: Message) -> Row:
        """Append the reply (the engine's tokens and log-probs, cut to the call's limit) to the call's row,
        or start a row with it; `reply` is the assistant message as returned to the agent (what a later call
        must send back to continue the row)."""
        toks, lps = list(completion.token_ids)[:call.max_tokens], list(completion.logprobs)[:call.max_tokens]
        ended = bool(toks) and toks[-1] in set(stop_ids)
        with self._lock:
            self.counts.calls += 1
            row = call.row
            if row is not None and len(row.ids) != call.base:  # another call grew it meanwhile: a branch
                self.counts.branches += 1
                row = None
            if row is None:
                row = Row(list(call.prompt), call.tools_key)
                self.rows.append(row)
            else:
                row.append(call.added, None, trained=False)
            start = len(row.prompt) + len(row.ids)
            row.append(toks, lps, trained=True)
            written = self.renderer.decode(row.prompt + row.ids[:len(row.ids) - int(ended)])
            before = self.renderer.decode(row.prompt + row.ids[:start - len(row.prompt)])
            text = call.prefill + written[len(before):] if written.startswith(before) else call.prefill
            answered = normalize(reply)
            answered["content"] = call.prefill + answered["content"]  # the agent holds the prefill and the reply
            row.messages = list(call.messages[:-1] if call.prefill else call.messages) + [answered]
            row.written = {**(row.written if call.row is row else {}), len(row.messages) - 1: text}
            row.stop_text = self.renderer.decode([toks[-1]]) if ended else None
            row.replies += 1
            row.last_reply = str(reply.get("content") or "")
            if not ended and len(toks) >= call.max_tokens and call.budget_cut:
                row.truncated = True
            return row
