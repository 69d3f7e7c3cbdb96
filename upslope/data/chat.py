"""Token ids of a chat conversation and its assistant-only loss mask, from the real chat template.

The mask is found without knowing the template's markup: the conversation is rendered in
growing prefixes, and the tokens an assistant turn adds after its header (the render with
`add_generation_prompt=True` of the turns before it) are that turn's; of those, the content
up to and including the first stop token (e.g. `<|im_end|>`) is trained, and template text
after it (a newline between turns) is not, since the model never generates it. This needs
a template whose renders grow by appending (each prefix's tokens start the next render's);
one that rewrites earlier turns (e.g. drops past reasoning) is a clear error.
"""
from __future__ import annotations

from typing import Any, Sequence

from upslope.errors import DataError


def render_ids(tokenizer: Any, messages: Sequence[dict[str, str]], generation_prompt: bool) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template (as prompts are encoded)."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def assistant_mask(messages: Sequence[dict[str, str]], tokenizer: Any, stop_ids: Sequence[int],
                   where: str = "conversation") -> tuple[list[int], list[int]]:
    """(token ids of the whole conversation, mask) with mask 1 exactly on each assistant turn's
    content and its end-of-turn stop token, 0 on system/user turns, role headers and separators."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: the tokenizer has no chat template (give one with model.chat_template)")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message to train on")
    if messages[0]["role"] == "assistant":
        raise DataError(f"{where}: the conversation starts with an assistant message (nothing to condition on)")
    full = render_ids(tokenizer, messages, False)
    mask = [0] * len(full)
    stops = set(int(s) for s in stop_ids)
    for j, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        header = render_ids(tokenizer, messages[:j], True)
        turn = render_ids(tokenizer, messages[:j + 1], False)
        _check_prefix(header, turn, where, f"the turns before assistant message {j + 1} plus the generation prompt",
                      f"the turns up to message {j + 1}")
        _check_prefix(turn, full, where, f"the turns up to message {j + 1}", "the whole conversation")
        if header == render_ids(tokenizer, messages[:j], False):
            raise DataError(f"{where}: the chat template ignores add_generation_prompt, so the assistant header "
                            f"cannot be told from the reply")
        end = len(turn)
        for t in range(len(header), len(turn)):
            if turn[t] in stops:
                end = t + 1
                break
        mask[len(header):end] = [1] * (end - len(header))
    return full, mask


def _check_prefix(short: list[int], long: list[int], where: str, what_short: str, what_long: str) -> None:
    if long[:len(short)] == short:
        return
    at = next((i for i, (a, b) in enumerate(zip(short, long)) if a != b), min(len(short), len(long)))
    raise DataError(f"{where}: the chat template is not prefix-stable: rendering {what_short} is not a prefix of "
                    f"rendering {what_long} (they differ at token {at}); the assistant-only mask needs a template "
                    f"whose renders grow by appending")
