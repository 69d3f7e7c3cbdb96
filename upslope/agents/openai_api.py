"""The OpenAI chat-completions wire format, as far as the policy server speaks it: a request body
checked into a `ChatRequest` (what it cannot honour is refused in one line, never silently dropped),
and the reply built from the model's tokens (tool calls parsed by the run's tool-call format).

Sampling settings in a request (temperature, top_p, seed, ...) are not applied: the policy samples with
the rollout's settings, since the sampler's log-probs are what the learner corrects against."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

_ROLES = {"system", "developer", "user", "assistant", "tool"}


class RequestError(ValueError):
    """A request the server refuses: an HTTP status, an OpenAI error code and one line."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    parse_tools: bool = True  # tool_choice "none" turns parsing off
    max_tokens: int | None = None
    prefill: bool = False  # continue_final_message: the last message is an assistant turn the reply continues
    logprobs: bool = False
    token_ids: bool = False  # return_token_ids: the prompt's and the reply's token ids in the response (as vLLM's server)
    model: str = ""


def parse_request(body: Any) -> ChatRequest:
    """A chat-completions request body as a ChatRequest; a RequestError says what is wrong or unsupported."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError("streaming is not supported: send stream=false")
    if int(body.get("n") or 1) != 1:
        raise RequestError("n must be 1 (each call is one reply of the trajectory)")
    if body.get("stop"):
        raise RequestError("stop sequences are not supported: the policy ends its turn with its own end token")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise RequestError(f"messages[{i}]: each message needs a role, one of {', '.join(sorted(_ROLES))}")
        if m["role"] == "developer":
            messages[i] = {**m, "role": "system"}
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools):
        raise RequestError('tools must be a list of {"type": "function", "function": {...}} objects')
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError("max_tokens must be a positive integer")
    prefill = bool(body.get("continue_final_message"))
    if prefill and messages[-1].get("role") != "assistant":
        raise RequestError("continue_final_message needs the last message to be an assistant turn")
    return ChatRequest(messages=list(messages), tools=list(tools), parse_tools=body.get("tool_choice") != "none",
                       max_tokens=max_tokens, prefill=prefill, logprobs=bool(body.get("logprobs")),
                       token_ids=bool(body.get("return_token_ids")), model=str(body.get("model") or ""))


def tool_calls(text: str, tool_format: Any) -> list[dict[str, Any]]:
    """The tool calls in a reply's text, in the OpenAI shape (arguments as a JSON string); calls the format
    cannot parse are left in the text only."""
    out = []
    for call in tool_format.parse(text):
        if call.error or not call.name:
            continue
        out.append({"id": f"call_{uuid.uuid4().hex[:16]}", "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)}})
    return out


def reply_message(text: str, calls: list[dict[str, Any]]) -> Message:
    """The assistant message of a reply: its whole text as content (tool calls included as the model wrote
    them) and the parsed calls."""
    msg: Message = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return msg


def completion_body(message: Message, *, model: str, finish_reason: str, prompt_ids: list[int], reply_ids: list[int],
                    token_logprobs: list[tuple[str, float]] | None = None, token_ids: bool = False) -> dict[str, Any]:
    """A chat.completion response object (with `token_ids`, the prompt's and the reply's ids beside it)."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
    if token_logprobs is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                          for t, lp in token_logprobs]}
    body = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(reply_ids),
                      "total_tokens": len(prompt_ids) + len(reply_ids)}}
    if token_ids:
        choice["token_ids"] = list(reply_ids)
        body["prompt_token_ids"] = list(prompt_ids)
    return body


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "upslope"}]}


def error_body(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}}
