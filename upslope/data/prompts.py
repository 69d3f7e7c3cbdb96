"""Turn Examples into prompt token ids with the tokenizer's chat template."""
from __future__ import annotations

from typing import Any, Sequence

from upslope.data.types import Example
from upslope.errors import DataError


def encode_prompts(examples: Sequence[Example], tokenizer: Any, *, system_prompt: str | None = None,
                   use_chat_template: bool = True, max_prompt_tokens: int | None = None,
                   drop_long: bool = False) -> tuple[list[list[int]], list[int]]:
    """Token ids of each prompt (an example's `prefill` opens the assistant's reply), and the indices
    of the examples kept. A prompt longer than
    `max_prompt_tokens` or than the model's context (the tokenizer's model_max_length) is an
    error naming it, or is dropped when `drop_long`."""
    ids: list[list[int]] = []
    kept: list[int] = []
    context = getattr(tokenizer, "model_max_length", None)
    context = context if isinstance(context, int) and 0 < context < 10**8 else None
    for i, ex in enumerate(examples):
        where = ex.meta.get("source", f"example {ex.id or i}")
        msgs = ex.messages(system_prompt) + ([{"role": "assistant", "content": ex.prefill}] if ex.prefill else [])
        if use_chat_template and getattr(tokenizer, "chat_template", None):
            text = render_chat(tokenizer, msgs, not ex.prefill, where, continue_final=bool(ex.prefill))
        else:
            text = "\n\n".join(m["content"] for m in msgs)
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        if context is not None and len(toks) >= context:
            if drop_long:
                continue
            raise DataError(f"{where}: prompt has {len(toks)} tokens, at or over the model's context of {context} "
                            f"tokens (shorten it, or set rollout.drop_long_prompts=true to drop such prompts)")
        if max_prompt_tokens is not None and len(toks) > max_prompt_tokens:
            if drop_long:
                continue
            raise DataError(f"{where}: prompt has {len(toks)} tokens, over rollout.max_prompt_tokens="
                            f"{max_prompt_tokens} (raise it or set rollout.drop_long_prompts=true)")
        ids.append(list(toks))
        kept.append(i)
    return ids, kept


def render_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], generation_prompt: bool, where: str,
                continue_final: bool = False) -> str:
    """The chat template applied to `messages` (with `continue_final`, the last message, an assistant
    turn, is left open for the model to continue: a prefilled reply); a template that fails on them
    (a Jinja error, `raise_exception`) is one DataError line naming the example and model.chat_template."""
    import jinja2

    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                                             continue_final_message=continue_final)
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: the chat template failed on this conversation ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); check model.chat_template") from None
