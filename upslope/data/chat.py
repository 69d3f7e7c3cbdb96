"""Token ids of a chat conversation and its assistant-only loss mask, from the real chat template.

The mask is found without knowing the template's markup: the conversation is rendered in
growing prefixes. An assistant turn is the text its render appends to the render of the turns
before it with `add_generation_prompt=True` (the context plus the assistant header); of its
tokens, the content up to and including the first stop token (e.g. `<|im_end|>`) is trained,
and template text after it (a newline between turns) is not, since the model never generates
it. This needs a template whose renders grow by appending, up to each assistant turn's stop token:
text a template writes only at the end of a conversation (Phi-3's final eos) is allowed after it,
but one that rewrites an earlier turn's content (Qwen3's drops the reasoning of turns before the
last user message) is a clear error, since the ids trained on would not be the ids the model wrote.
A template with no generation prompt (Mistral's: the reply follows `[/INST]`) is read the same way,
provided the reply it appends starts with the message's content; one that writes a header there
(which the model would then learn to write) is a clear error.

The text is tokenised piecewise at the turn boundaries: the context before a reply is
tokenised on its own, exactly as a prompt is at generation time, and the reply on its own,
as the model would generate it. (Tokenising the whole text at once can merge a reply's leading
whitespace with the header's newline into one token that belongs to neither.)
"""
from __future__ import annotations

from typing import Any, Sequence

from upslope.errors import DataError


def render(tokenizer: Any, messages: Sequence[dict[str, Any]], generation_prompt: bool,
           where: str = "conversation") -> str:
    """The text of `messages` through the tokenizer's chat template (a failing template is one
    DataError line)."""
    from upslope.data.prompts import render_chat

    return render_chat(tokenizer, messages, generation_prompt, where)


def assistant_mask(messages: Sequence[dict[str, Any]], tokenizer: Any, stop_ids: Sequence[int],
                   where: str = "conversation") -> tuple[list[int], list[int]]:
    """(token ids of the whole conversation, mask) with mask 1 exactly on each assistant turn's
    content and its end-of-turn stop token, 0 on system/user turns, role headers and separators."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: the tokenizer has no chat template (give one with model.chat_template)")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message to train on")
    if messages[0]["role"] == "assistant":
        raise DataError(f"{where}: the conversation starts with an assistant message (nothing to condition on)")
    full = render(tokenizer, messages, False, where)
    stop_texts = [text for text in (tokenizer.decode([int(s)]) for s in stop_ids) if text]
    spans: list[tuple[int, int]] = []  # character spans of the assistant turns (after their headers)
    for j, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        header = render(tokenizer, messages[:j], True, where)
        turn = render(tokenizer, messages[:j + 1], False, where)
        _check_prefix(header, turn, where, f"the turns before message {j + 1} with the generation prompt",
                      f"the turns up to message {j + 1}")
        if header == render(tokenizer, messages[:j], False, where):
            _check_reply_opens_with_content(turn[len(header):], msg.get("content"), where)
        end = _turn_end(header, turn, full, stop_texts)
        if end is None:
            _check_prefix(turn, full, where, f"the turns up to message {j + 1}", "the whole conversation")
        if spans and len(header) < spans[-1][1]:
            raise DataError(f"{where}: the chat template is not prefix-stable: message {j + 1}'s context is shorter "
                            f"than the conversation before it")
        spans.append((len(header), end if end is not None else len(turn)))
    stops = set(int(s) for s in stop_ids)
    ids: list[int] = []
    mask: list[int] = []
    pos = 0
    for start, end in spans:
        context = _tokens(tokenizer, full[pos:start])
        reply = _tokens(tokenizer, full[start:end])
        trained = next((i + 1 for i, t in enumerate(reply) if t in stops), len(reply))
        ids += context + reply
        mask += [0] * len(context) + [1] * trained + [0] * (len(reply) - trained)
        pos = end
    tail = _tokens(tokenizer, full[pos:])
    return ids + tail, mask + [0] * len(tail)


def _turn_end(header: str, turn: str, full: str, stop_texts: Sequence[str]) -> int | None:
    """Where the assistant turn that `turn` ends with ends in `full`: the end of `turn` when `full` goes on
    from it; else the end of the turn's first stop token when `full` agrees with `turn` that far (the
    template writes something else only after the reply, e.g. a conversation-final eos); else None."""
    if full.startswith(turn):
        return len(turn)
    found = [at + len(text) for text in stop_texts if (at := turn.find(text, len(header))) >= 0]
    if not found:
        return None
    end = min(found)
    return end if full[:end] == turn[:end] else None


def _check_reply_opens_with_content(reply: str, content: Any, where: str) -> None:
    """For a template without a generation prompt: the text an assistant turn appends must start with
    its content (whitespace aside), else the template wrote a header there that would be trained."""
    text = content.strip() if isinstance(content, str) else ""
    if text and not reply.lstrip().startswith(text):
        cut = reply.find(text)
        head = reply[:cut] if cut > 0 else reply[:20]
        raise DataError(f"{where}: the chat template ignores add_generation_prompt and writes {head!r} before the "
                        f"reply, so the assistant header cannot be told from the reply")


def _tokens(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _check_prefix(short: str, long: str, where: str, what_short: str, what_long: str) -> None:
    if long.startswith(short):
        return
    at = next((i for i, (a, b) in enumerate(zip(short, long)) if a != b), min(len(short), len(long)))
    raise DataError(f"{where}: the chat template is not prefix-stable: rendering {what_short} is not a prefix of "
                    f"rendering {what_long} (they differ at character {at}: {long[at:at + 20]!r}); the "
                    f"assistant-only mask needs a template whose renders grow by appending (give one with "
                    f"model.chat_template, or split the conversation at its assistant turns)")
