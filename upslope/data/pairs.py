"""Preference pairs from a file (JSONL, Parquet, HF dataset directory): a prompt, a chosen and
a rejected reply per record, field names configurable; TRL's preference rows with an implicit prompt
(no prompt column: chosen and rejected share it as their opening) are split at what they share. A bad
record is one error line naming the file, the line (or row) and the field."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from upslope.data.sources import read_records, require_field
from upslope.data.types import Example
from upslope.errors import ConfigError, DataError

if TYPE_CHECKING:  # data reads config sections; config consults the registries data fills
    from upslope.config import DPOConfig, RMConfig


@dataclass
class PreferencePair:
    """One record: the prompt (an Example, so it goes through the chat template like RL
    prompts) and the texts of the preferred and the dispreferred reply."""

    prompt: Example
    chosen: str
    rejected: str


def load_pairs(cfg: DPOConfig | RMConfig, section: str = "dpo") -> list[PreferencePair]:
    """The pairs of `cfg.path` (the first `cfg.limit`); errors name the options of `section`."""
    if not cfg.path:
        raise ConfigError(f"{section}.path: {section}.source=dataset needs a file of pairs (JSONL, Parquet or an HF "
                          "dataset directory with prompt, chosen and rejected fields)")
    out: list[PreferencePair] = []
    for where, rec in read_records(cfg.path, cfg.split):
        if cfg.limit is not None and len(out) >= cfg.limit:
            break
        if cfg.prompt_field not in rec and cfg.chosen_field in rec and cfg.rejected_field in rec:
            rec = implicit_prompt(rec, cfg.prompt_field, cfg.chosen_field, cfg.rejected_field, where)
        prompt = _prompt(rec, cfg.prompt_field, where, f"{section}.prompt_field")
        chosen = _reply(rec, cfg.chosen_field, where, f"{section}.chosen_field")
        rejected = _reply(rec, cfg.rejected_field, where, f"{section}.rejected_field")
        ex = Example(prompt=prompt, meta={"source": where}, id=str(rec.get("id", len(out))))
        out.append(PreferencePair(ex, chosen, rejected))
    if not out:
        raise DataError(f"{cfg.path}: no preference pairs in this file")
    return out


def implicit_prompt(rec: dict[str, Any], prompt: str, chosen: str, rejected: str, where: str) -> dict[str, Any]:
    """A preference row with its prompt made explicit: the messages chosen and rejected open with alike, or
    (for text) their shared opening up to the last whitespace, so no word is split."""
    a, b = rec[chosen], rec[rejected]
    if _is_messages(a) and _is_messages(b):
        k = 0
        while k < min(len(a), len(b)) - 1 and a[k] == b[k]:
            k += 1
        shared, ra, rb = a[:k], a[k:], b[k:]
    elif isinstance(a, str) and isinstance(b, str):
        k = len(os.path.commonprefix([a, b]))
        k = max((i + 1 for i in range(k) if a[i].isspace()), default=0)
        shared, ra, rb = a[:k].rstrip(), a[k:], b[k:]
        ra, rb = (" " + ra, " " + rb) if shared and a[k - 1] == " " else (ra, rb)
    else:
        shared, ra, rb = None, a, b
    if not shared:
        raise DataError(f"{where}: no '{prompt}' field, and '{chosen}' and '{rejected}' share no opening to take as "
                        f"the prompt (TRL's implicit prompt); add a '{prompt}' field")
    return {**rec, prompt: shared, chosen: ra, rejected: rb}


def encode_reply(tokenizer: Any, text: str, end_id: int) -> list[int]:
    """A reply's token ids as the policy would generate them after the prompt's generation
    header: its text tokens, then the token that ends an assistant turn."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [end_id]


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else type(value).__name__


def _prompt(rec: dict[str, Any], name: str, where: str, option: str) -> str | list[dict[str, str]]:
    value = require_field(rec, name, where, option)
    if isinstance(value, str):
        return value
    if _is_messages(value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataError(f"{where}: field '{name}' must be text or a list of {{role, content}} messages, "
                    f"got {_kind(value)}")


def _reply(rec: dict[str, Any], name: str, where: str, option: str) -> str:
    value = require_field(rec, name, where, option)
    if isinstance(value, str):
        return value
    if _is_messages(value) and value[-1]["role"] == "assistant":
        return value[-1]["content"]
    raise DataError(f"{where}: field '{name}' must be text or chat messages ending with the assistant reply, "
                    f"got {_kind(value)}")


def reply_ids(pairs: Sequence[PreferencePair], tokenizer: Any, end_id: int) -> list[tuple[list[int], list[int]]]:
    """(chosen ids, rejected ids) of each pair."""
    return [(encode_reply(tokenizer, p.chosen, end_id), encode_reply(tokenizer, p.rejected, end_id)) for p in pairs]
