"""Preference pairs from files: JSONL / Parquet / HF dataset directory, text or chat-message
fields, configurable names, and one-line errors naming file, line and field."""
from __future__ import annotations

import json

import pytest

from upslope.config import DPOConfig
from upslope.data.pairs import encode_reply, load_pairs
from upslope.data.prompts import encode_prompts
from upslope.errors import ConfigError, DataError

ROWS = [
    {"prompt": "What is 3 * 4?", "chosen": "12", "rejected": "7"},
    {"prompt": [{"role": "user", "content": "What is 2 * 5?"}],
     "chosen": [{"role": "user", "content": "What is 2 * 5?"}, {"role": "assistant", "content": "10"}],
     "rejected": [{"role": "assistant", "content": "25"}]},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_text_and_message_fields(tmp_path):
    pairs = load_pairs(DPOConfig(path=write_jsonl(tmp_path / "p.jsonl", ROWS)))
    assert [(p.chosen, p.rejected) for p in pairs] == [("12", "7"), ("10", "25")]
    assert pairs[0].prompt.prompt == "What is 3 * 4?"
    assert pairs[1].prompt.prompt == [{"role": "user", "content": "What is 2 * 5?"}]
    assert pairs[0].prompt.meta["source"].endswith("p.jsonl:1")


def test_parquet_hf_directory_field_names_and_limit(tmp_path):
    import datasets

    rows = [{"q": r["prompt"] if isinstance(r["prompt"], str) else "x", "good": "a", "bad": "b"} for r in ROWS]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "p.parquet"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "hf"))
    for path in (tmp_path / "p.parquet", tmp_path / "hf"):
        cfg = DPOConfig(path=str(path), prompt_field="q", chosen_field="good", rejected_field="bad")
        pairs = load_pairs(cfg)
        assert [(p.prompt.prompt, p.chosen, p.rejected) for p in pairs] == [("What is 3 * 4?", "a", "b"), ("x", "a", "b")]
        assert len(load_pairs(cfg.model_copy(update={"limit": 1}))) == 1


@pytest.mark.parametrize("line, expected", [
    ('{"prompt": "q", "rejected": "b"}', "p.jsonl:2: field 'chosen' missing (dpo.chosen_field; fields here: prompt, rejected)"),
    ('{"prompt": 3, "chosen": "a", "rejected": "b"}', "p.jsonl:2: field 'prompt' must be text or a list of {role, content} messages, got int"),
    ('{"prompt": "q", "chosen": "a", "rejected": [{"role": "user", "content": "b"}]}',
     "p.jsonl:2: field 'rejected' must be text or chat messages ending with the assistant reply, got list"),
    ('{"prompt": "q", "chosen": [], "rejected": "b"}', "p.jsonl:2: field 'chosen' must be text or chat messages ending with the assistant reply, got an empty list"),
    ('{"prompt": "q", "chosen": "a",', "p.jsonl:2: invalid JSON"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, line, expected):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(DataError) as err:
        load_pairs(DPOConfig(path=str(path)))
    msg = str(err.value)
    assert "\n" not in msg and expected in msg, msg


def test_missing_path_and_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="dpo.path"):
        load_pairs(DPOConfig())
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no preference pairs"):
        load_pairs(DPOConfig(path=str(tmp_path / "e.jsonl")))
    with pytest.raises(DataError, match="data file not found"):
        load_pairs(DPOConfig(path=str(tmp_path / "missing.jsonl")))


def test_prompt_plus_reply_tokens_are_the_chat_template_conversation(tokenizer, tmp_path):
    """On the real SmolLM2 template: prompt ids (generation prompt) + reply ids (text, then
    <|im_end|>) are exactly the templated conversation, up to the newline after <|im_end|>."""
    row = {"prompt": "What is 7 * 8?", "chosen": "56", "rejected": "The answer is 54."}
    pair = load_pairs(DPOConfig(path=write_jsonl(tmp_path / "p.jsonl", [row])))[0]
    ids, _ = encode_prompts([pair.prompt], tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == end
    for reply in (pair.chosen, pair.rejected):
        got = ids[0] + encode_reply(tokenizer, reply, end)
        conv = pair.prompt.messages() + [{"role": "assistant", "content": reply}]
        text = tokenizer.apply_chat_template(conv, tokenize=False)
        want = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert got == want[: len(got)] and tokenizer.decode(want[len(got):]).strip() == ""

