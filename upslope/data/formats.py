"""The layouts the field writes prompt datasets in, recognised by their columns: TRL's prompt-only and
prompt-completion rows (standard: text; conversational: a `prompt` list of chat messages), TRL's
`messages` rows, verl's parquet schema (`prompt` messages, `reward_model.ground_truth`, `data_source`,
`extra_info`) and SkyRL's (`reward_spec.ground_truth`).

Detection fills in only a field the config left at its default that this record cannot be read
with; a field the user set is used as given. What was detected is said in one line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from upslope.data.sources import CHAT_ROLES, lookup

if TYPE_CHECKING:  # data reads config sections; config consults the registries data fills
    from upslope.config import DataConfig

# where a reference answer lives, in the order tried when the record has no `answer`
ANSWER_FIELDS = ("reward_model.ground_truth", "reward_spec.ground_truth", "solution", "ground_truth")
# a prompt written as text under another common name (GSM8K's question, MATH's problem)
PROMPT_TEXT_FIELDS = ("question", "problem")


@dataclass(frozen=True)
class FieldMap:
    """How records are read: the prompt (text or chat messages) and answer fields; `layout` names the
    recognised format and `detected` the options detection set (empty: the config read as given)."""

    prompt_field: str
    messages_field: str | None
    answer_field: str | None
    layout: str = ""
    detected: tuple[str, ...] = ()

    def note(self, where: str) -> str | None:
        """The one line saying what was detected, None when nothing was."""
        if not self.detected:
            return None
        return f"data: {where} read as {self.layout} (detected from its columns): {', '.join(self.detected)}"


def is_messages(value: Any) -> bool:
    """A non-empty list of {role, content} chat messages with known roles."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and m.get("role") in CHAT_ROLES and "content" in m for m in value)


def layout_of(rec: dict[str, Any], conversational: bool) -> str:
    """The name of the format a record is in, from its columns."""
    if "reward_model" in rec and "data_source" in rec:
        return "verl's schema"
    if "reward_spec" in rec:
        return "SkyRL's schema"
    style = "conversational" if conversational else "standard"
    if "chosen" in rec and "rejected" in rec:
        return f"TRL {style} preference"
    if "completion" in rec and "label" in rec:
        return f"TRL {style} unpaired preference"
    if "completion" in rec:
        return f"TRL {style} prompt-completion"
    if "prompt" in rec:
        return f"TRL {style} prompt-only"
    if "messages" in rec:
        return "TRL conversational language modeling"
    return "prompt and answer columns"


def detect_fields(rec: dict[str, Any], cfg: DataConfig) -> FieldMap:
    """The field mapping for records like `rec`: the config's, with each field it left at the default
    and that `rec` cannot be read with replaced by the column that holds it."""
    defaults = {k: f.default for k, f in type(cfg).model_fields.items()}
    prompt, messages, answer = cfg.prompt_field, cfg.messages_field, cfg.answer_field
    detected: list[str] = []
    if messages is None and prompt == defaults["prompt_field"]:
        if is_messages(rec.get(prompt)):
            messages = prompt
            detected.append(f"data.messages_field={prompt}")
        elif prompt not in rec and is_messages(rec.get("messages")):
            messages = "messages"
            detected.append("data.messages_field=messages")
        elif prompt not in rec:
            text = next((f for f in PROMPT_TEXT_FIELDS if isinstance(rec.get(f), str)), None)
            if text is not None:
                prompt = text
                detected.append(f"data.prompt_field={text}")
    if answer == defaults["answer_field"] and not lookup(rec, answer)[0]:
        found = next((f for f in ANSWER_FIELDS if lookup(rec, f)[0]), None)
        if found is not None:
            answer = found
            detected.append(f"data.answer_field={found}")
    conversational = messages is not None
    return FieldMap(prompt, messages, answer, layout_of(rec, conversational), tuple(detected))
