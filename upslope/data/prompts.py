"""Turn Examples into prompt token ids with the tokenizer's chat template."""
from __future__ import annotations

from typing import Any, Sequence

from upslope.data.types import Example
from upslope.errors import DataError


def encode_prompts(examples: Sequence[Example], tokenizer: Any, *, system_prompt: str | None = None,
                   use_chat_template: bool = True, max_prompt_tokens: int | None = None,
                   drop_long: bool = False) -> tuple[list[list[int]], list[int]]:
    """Token ids of each prompt, and the indices of the examples kept. A prompt longer than
    `max_prompt_tokens` is an error naming it, or is dropped when `drop_long`."""
    ids: list[list[int]] = []
    kept: list[int] = []
    for i, ex in enumerate(examples):
        if use_chat_template and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(ex.messages(system_prompt), tokenize=False,
                                                 add_generation_prompt=True)
        else:
            msgs = ex.messages(system_prompt)
            text = "\n\n".join(m["content"] for m in msgs)
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_prompt_tokens is not None and len(toks) > max_prompt_tokens:
            if drop_long:
                continue
            where = ex.meta.get("source", f"example {ex.id or i}")
            raise DataError(f"{where}: prompt has {len(toks)} tokens, over rollout.max_prompt_tokens="
                            f"{max_prompt_tokens} (raise it or set rollout.drop_long_prompts=true)")
        ids.append(list(toks))
        kept.append(i)
    return ids, kept
