"""Turn Examples into prompt token ids with the tokenizer's chat template."""
from __future__ import annotations

import json
from typing import Any, Sequence

from upslope.data.types import Example
from upslope.errors import ConfigError, DataError


def encode_prompts(examples: Sequence[Example], tokenizer: Any, *, system_prompt: str | None = None,
                   use_chat_template: bool = True, max_prompt_tokens: int | None = None,
                   drop_long: bool = False, max_new_tokens: int | None = None,
                   new_tokens_option: str = "rollout.max_new_tokens") -> tuple[list[list[int]], list[int]]:
    """Token ids of each prompt (an example's `prefill` opens the assistant's reply), and the indices
    of the examples kept. A prompt longer than `max_prompt_tokens` or than the model's context (the
    tokenizer's model_max_length) less the `max_new_tokens` it will be given is an error naming it, or
    is dropped when `drop_long`; `max_new_tokens` alone at or over the context is a ConfigError. Each distinct conversation is rendered once
    and all are tokenised in batched calls (seeded tasks repeat prompts; a call per prompt cost
    ~2 ms each on a 2-core CPU, 20 s for a 10,000-prompt split)."""
    chat = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    where_of = [ex.meta.get("source", f"example {ex.id or i}") for i, ex in enumerate(examples)]
    slot_of: list[int] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    for i, ex in enumerate(examples):
        msgs = ex.messages(system_prompt) + ([{"role": "assistant", "content": ex.prefill}] if ex.prefill else [])
        key = json.dumps(msgs, sort_keys=True, default=str)
        if key not in seen:
            seen[key] = len(texts)
            texts.append(render_chat(tokenizer, msgs, not ex.prefill, where_of[i], continue_final=bool(ex.prefill))
                         if chat else "\n\n".join(m["content"] for m in msgs))
        slot_of.append(seen[key])
    encoded = _tokenize_all(tokenizer, texts)
    context = model_context(tokenizer)
    new = max_new_tokens or 0
    check_reply_fits(tokenizer, new, new_tokens_option)
    ids: list[list[int]] = []
    kept: list[int] = []
    for i, slot in enumerate(slot_of):
        toks = encoded[slot]
        if context is not None and len(toks) + new > context:
            if drop_long:
                continue
            size = f"; with {new_tokens_option}={new} that is {len(toks) + new}," if new else ","
            raise DataError(f"{where_of[i]}: prompt has {len(toks)} tokens{size} over the model's context of "
                            f"{context} tokens (shorten it, or set rollout.drop_long_prompts=true to drop such prompts)")
        if max_prompt_tokens is not None and len(toks) > max_prompt_tokens:
            if drop_long:
                continue
            raise DataError(f"{where_of[i]}: prompt has {len(toks)} tokens, over rollout.max_prompt_tokens="
                            f"{max_prompt_tokens} (raise it or set rollout.drop_long_prompts=true)")
        ids.append(list(toks))
        kept.append(i)
    return ids, kept


def model_context(tokenizer: Any) -> int | None:
    """The model's context in tokens (the tokenizer's model_max_length, set from the model config), if known."""
    context = getattr(tokenizer, "model_max_length", None)
    return context if isinstance(context, int) and 0 < context < 10**8 else None


def check_reply_fits(tokenizer: Any, max_new_tokens: int | None, option: str) -> None:
    """A reply length at or over the model's context is a ConfigError naming `option` (sampling past the
    context runs beyond the positions the model was trained on, for as long as the number says)."""
    check_reply_within(model_context(tokenizer), max_new_tokens, option)


def check_reply_within(context: int | None, max_new_tokens: int | None, option: str) -> None:
    """check_reply_fits against a context length (None: unknown, no check)."""
    if context is not None and max_new_tokens and max_new_tokens >= context:
        raise ConfigError(f"{option}={max_new_tokens} is at or over the model's context of {context} tokens "
                          f"(prompt and reply must fit in it together)")


def _tokenize_all(tokenizer: Any, texts: list[str], chunk: int = 2048) -> list[list[int]]:
    """Token ids of every text, without special tokens, in batched tokenizer calls."""
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        out.extend(tokenizer(texts[start:start + chunk], add_special_tokens=False)["input_ids"])
    return out


def render_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], generation_prompt: bool, where: str,
                continue_final: bool = False) -> str:
    """The chat template applied to `messages` (with `continue_final`, the last message, an assistant
    turn, is left open for the model to continue: a prefilled reply); a template that fails on them
    (a Jinja error, `raise_exception`) is one DataError line naming the example and model.chat_template,
    and its system message when it has one (a template without a system role refuses it)."""
    import jinja2

    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                                             continue_final_message=continue_final)
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        system = any(m.get("role") == "system" for m in messages)
        hint = (" (it has a system message, from data.system_prompt or the data itself: some templates, e.g. "
                "Gemma 2's, have no system role)" if system else "")
        raise DataError(f"{where}: the chat template failed on this conversation ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}){hint}; check model.chat_template") from None
