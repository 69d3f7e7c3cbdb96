"""Supervised fine-tuning data: rows of a JSONL/Parquet file or dataset directory, each a chat
(`data.messages_field`) or a prompt/response pair (or one of TRL's SFT layouts: `messages`, or
`prompt` + `completion`), turned into token ids and an assistant-only loss mask through the model's
chat template.

A prompt goes through the same path as RL prompts (data.template, data.system_prompt, the
chat template); a chat row gets data.system_prompt when it has no system message. A bad
row is one error line naming the file, line (or row) and field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from upslope.batch import Batch, build_batch
from upslope.data.chat import assistant_mask
from upslope.data.formats import is_messages
from upslope.data.sources import apply_template, read_records, require_messages, require_text
from upslope.data.types import Example
from upslope.errors import DataError

if TYPE_CHECKING:  # data reads config sections; config consults the registries data fills
    from upslope.config import DataConfig


@dataclass
class Conversation:
    """One training conversation and where it came from (file:line)."""

    messages: list[dict[str, Any]]
    where: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class EncodedExample:
    """Token ids of a conversation and the loss mask (1 on assistant tokens)."""

    ids: list[int]
    mask: list[int]
    where: str


def load_conversations(data: DataConfig, response_field: str) -> list[Conversation]:
    """The conversations in `data.path`: each row's `data.messages_field` list, or its
    `data.prompt_field` text as a user turn (through data.template) and `response_field` as the reply."""
    if not data.path:
        raise DataError("sft: data.path is empty (give a JSONL/Parquet file or dataset directory of chats "
                        "or prompt/response pairs)")
    out: list[Conversation] = []
    for where, rec in read_records(data.path, data.split):
        if data.limit is not None and len(out) >= data.limit:
            break
        trl = trl_conversation(rec, data, response_field, where)
        if trl is not None:
            prompt: Any = trl
        elif data.messages_field:
            prompt = require_messages(rec, data.messages_field, where)
        else:
            text = require_text(rec, data.prompt_field, where, "data.prompt_field",
                         " (chat rows: set data.messages_field, e.g. data.messages_field=messages)",
                         messages_option="data.messages_field")
            reply = require_text(rec, response_field, where, "sft.response_field")
            prompt = [{"role": "user", "content": apply_template(data.template, text, rec, where)},
                      {"role": "assistant", "content": reply}]
        msgs = Example(prompt=prompt).messages(data.system_prompt)
        used = (data.messages_field, data.prompt_field, response_field, *(TRL_SFT_FIELDS if trl is not None else ()))
        meta = {k: v for k, v in rec.items() if k not in used}
        out.append(Conversation(msgs, where, meta))
    if not out:
        raise DataError(f"{data.path}: no rows to train on")
    return out


TRL_SFT_FIELDS = ("prompt", "completion", "messages")


def trl_conversation(rec: dict[str, Any], data: DataConfig, response_field: str,
                     where: str) -> list[dict[str, Any]] | None:
    """A row in one of TRL's SFT layouts, as a conversation, when the config's fields are at their
    defaults: `messages` (conversational language modeling), or `prompt` + `completion` (standard
    text, or conversational message lists); None for any other row (read by the configured fields)."""
    if data.messages_field is not None or data.prompt_field != "prompt" or response_field in rec:
        return None
    if "prompt" not in rec and is_messages(rec.get("messages")):
        return require_messages(rec, "messages", where)
    prompt, completion = rec.get("prompt"), rec.get("completion")
    if is_messages(prompt) and is_messages(completion):
        return require_messages(rec, "prompt", where) + require_messages(rec, "completion", where)
    if isinstance(prompt, str) and isinstance(completion, str) and response_field == "response":
        text = require_text(rec, "prompt", where, "data.prompt_field")
        return [{"role": "user", "content": apply_template(data.template, text, rec, where)},
                {"role": "assistant", "content": require_text(rec, "completion", where, "sft.response_field")}]
    return None


def encode_conversations(convs: Sequence[Conversation], tokenizer: Any, stop_ids: Sequence[int], *,
                         max_tokens: int, drop_long: bool = False) -> list[EncodedExample]:
    """Token ids and assistant masks; a conversation over `max_tokens` is an error naming its
    row, or is dropped when `drop_long`."""
    out: list[EncodedExample] = []
    for conv in convs:
        ids, mask = assistant_mask(conv.messages, tokenizer, stop_ids, where=conv.where)
        if len(ids) > max_tokens:
            if drop_long:
                continue
            raise DataError(f"{conv.where}: conversation has {len(ids)} tokens, over sft.max_tokens={max_tokens} "
                            f"(raise it or set sft.drop_long=true)")
        out.append(EncodedExample(ids, mask, conv.where))
    if not out:
        raise DataError(f"sft: every conversation is over sft.max_tokens={max_tokens}")
    return out


def sft_batch(examples: Sequence[EncodedExample], pad_id: int) -> Batch:
    """A Batch of whole conversations: the 'prompt' is everything before the first trained
    token, and loss_mask is the assistant mask; each row is its own group."""
    prompts, rest, masks = [], [], []
    for ex in examples:
        first = max(1, ex.mask.index(1))  # token 0 has no context to be predicted from
        prompts.append(ex.ids[:first])
        rest.append(ex.ids[first:])
        masks.append(ex.mask[first:])
    return build_batch(prompts, rest, [[0.0] * len(r) for r in rest], list(range(len(examples))),
                       [False] * len(examples), pad_id, meta=[{"source": ex.where} for ex in examples],
                       completion_loss_masks=masks)
