"""Data: JSONL / Parquet / HF dataset sources, field mapping and templates, the errors that
name file:line and field, the built-in tasks on the real shared data files, and prompt
encoding with the real SmolLM2 chat template."""
from __future__ import annotations

import gzip
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.config import DataConfig
from upslope.data import load_examples, task_default_reward
from upslope.data.prompts import encode_prompts
from upslope.data.sources import read_records, records_to_examples
from upslope.data.tasks import arith, gsm8k, math500, shared_data_dir
from upslope.data.types import Example
from upslope.errors import DataError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = [
    {"id": "a", "prompt": "What is 2 + 2?", "answer": 4, "level": 1},
    {"id": "b", "prompt": "What is 3 * 5?", "answer": 15, "level": 2},
    {"id": "c", "prompt": "What is 9 - 4?", "answer": 5, "level": 3},
]


def write_jsonl(path, rows, gz: bool = False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def check_rows(examples: list[Example]):
    assert [e.prompt for e in examples] == [r["prompt"] for r in ROWS]
    assert [e.answer for e in examples] == [r["answer"] for r in ROWS]
    assert [e.id for e in examples] == ["a", "b", "c"]
    assert [e.meta["level"] for e in examples] == [1, 2, 3]  # other fields ride along in meta
    assert all("prompt" not in e.meta for e in examples)


# ------------------------------------------------------------------ sources


def test_jsonl_source(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS[:2])
    path.write_text(path.read_text() + "\n   \n" + json.dumps(ROWS[2]) + "\n")  # blank lines are skipped
    examples = records_to_examples(read_records(path))
    check_rows(examples)
    assert examples[0].meta["source"] == f"{path}:1"
    assert examples[2].meta["source"] == f"{path}:5"  # line numbers count the blank lines


def test_jsonl_gz_source(tmp_path):
    check_rows(records_to_examples(read_records(write_jsonl(tmp_path / "d.jsonl.gz", ROWS, gz=True))))


def test_parquet_source(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    examples = records_to_examples(read_records(path))
    check_rows(examples)
    assert examples[1].meta["source"] == f"{path}:row 2"


def test_hf_dataset_directory_source(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "flat"))
    check_rows(records_to_examples(read_records(tmp_path / "flat")))

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                               "test": datasets.Dataset.from_list(ROWS[:1])})
    dd.save_to_disk(str(tmp_path / "dict"))
    check_rows(records_to_examples(read_records(tmp_path / "dict")))  # default split: train
    only = records_to_examples(read_records(tmp_path / "dict", split="test"))
    assert [e.id for e in only] == ["a"] and only[0].meta["source"].endswith("[test]:row 1")
    with pytest.raises(DataError, match="no split 'valid' \\(has: train, test\\)"):
        list(read_records(tmp_path / "dict", split="valid"))


def test_directory_of_jsonl_files_by_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    assert len(records_to_examples(read_records(tmp_path, split="test"))) == 1
    assert len(records_to_examples(read_records(tmp_path, split="train"))) == 3


def test_source_errors(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        list(read_records(tmp_path / "missing.jsonl"))
    (tmp_path / "d.tsv").write_text("a\tb\n")
    with pytest.raises(DataError, match="unknown data format"):
        list(read_records(tmp_path / "d.tsv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a saved HF dataset"):
        list(read_records(tmp_path / "empty"))


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n" + '{"prompt": "x", "answer": \n')
    with pytest.raises(DataError) as info:
        records_to_examples(read_records(path))
    assert str(info.value).startswith(f"{path}:3: invalid JSON")


def test_non_object_line_names_file_and_line(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:2: expected a JSON object, got list")):
        records_to_examples(read_records(path))


def test_missing_prompt_field_names_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"question": "q?", "answer": 1}])
    with pytest.raises(DataError) as info:
        records_to_examples(read_records(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}:2: field 'prompt' missing (data.prompt_field")
    assert "fields here: question, answer" in msg


def test_missing_answer_field_names_file_line_and_option(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    with pytest.raises(DataError, match=re.escape(f"{path}:1: field 'answer' missing (data.answer_field")):
        records_to_examples(read_records(path))
    assert records_to_examples(read_records(path), answer_field=None)[0].answer is None


def test_non_text_prompt_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": 12, "answer": 1}])
    with pytest.raises(DataError, match=":1: field 'prompt' must be text, got int"):
        records_to_examples(read_records(path))


def test_chat_in_the_prompt_field_names_messages_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": [{"role": "user", "content": "Hi"}], "answer": 1}])
    msg = ":1: field 'prompt' must be text, got a list (chat messages?): set data.messages_field=prompt"
    with pytest.raises(DataError, match=re.escape(msg)):
        records_to_examples(read_records(path))
    with pytest.raises(DataError, match=re.escape("set eval.data.messages_field=prompt")):
        records_to_examples(read_records(path), option_prefix="eval.data")
    [ex] = records_to_examples(read_records(path), messages_field="prompt")
    assert ex.prompt == [{"role": "user", "content": "Hi"}]


def test_field_mapping_and_template(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "Add 2 and 3.", "sol": "5", "unit": "apples"}])
    [ex] = records_to_examples(read_records(path), prompt_field="q", answer_field="sol",
                               template="{prompt} Answer in {unit}.")
    assert ex.prompt == "Add 2 and 3. Answer in apples."
    assert ex.answer == "5" and ex.meta["unit"] == "apples" and "q" not in ex.meta
    with pytest.raises(DataError, match="data.template refers to field 'color'"):
        records_to_examples(read_records(path), prompt_field="q", answer_field="sol", template="{prompt} {color}")


def test_messages_field(tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
            {"role": "assistant", "content": "reference reply"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": msgs, "answer": "x"}])
    [ex] = records_to_examples(read_records(path), messages_field="messages")
    assert ex.prompt == msgs[:2]  # a final assistant turn (the reference) is dropped
    assert ex.messages("ignored: a system message exists") == msgs[:2]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"content": "no role"}], "answer": "x"}])
    with pytest.raises(DataError, match=":1: field 'messages' message 1 must be an object with text 'role' and 'content'"):
        records_to_examples(read_records(bad), messages_field="messages")
    with pytest.raises(DataError, match=":1: field 'conv' missing \\(data.messages_field"):
        records_to_examples(read_records(path), messages_field="conv")


def test_load_examples_from_path_with_limit_and_template(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = DataConfig(path=str(path), template="Q: {prompt}", limit=2)
    examples = load_examples(cfg)
    assert [e.prompt for e in examples] == ["Q: What is 2 + 2?", "Q: What is 3 * 5?"]
    assert task_default_reward(cfg) is None  # a file names no reward


def test_load_examples_empty_file_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no examples loaded"):
        load_examples(DataConfig(path=str(tmp_path / "empty.jsonl")))


# ------------------------------------------------------------------ tasks


def _solve(prompt: str) -> int:
    a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", prompt).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), ops=st.sampled_from(["*", "+", "-", "+-*", "-*"]), digits=st.integers(1, 3),
       allow_zero=st.booleans())
def test_arith_is_seeded_reproducible_and_correct(seed, ops, digits, allow_zero):
    kw = dict(ops=ops, digits=digits, count=30, seed=seed, allow_zero=allow_zero)
    train = arith(split="train", **kw)
    assert [(e.prompt, e.answer) for e in train] == [(e.prompt, e.answer) for e in arith(split="train", **kw)]
    test = arith(split="test", **kw)
    assert [e.prompt for e in train] != [e.prompt for e in test]
    lo = 10 ** (digits - 1) if digits > 1 else (0 if allow_zero else 1)
    for ex in train + test:
        assert ex.answer == _solve(ex.prompt)
        assert ex.meta["op"] in ops
        assert lo <= ex.meta["a"] <= 10**digits - 1 and lo <= ex.meta["b"] <= 10**digits - 1
    assert [e.id for e in test[:2]] == ["arith-test-0", "arith-test-1"]


def test_arith_hand_values():
    ex = arith(count=5, seed=3, ops="*")
    assert len(ex) == 5 and all(e.answer == e.meta["a"] * e.meta["b"] for e in ex)
    custom = arith(count=1, prompt="Compute {a}{op}{b}.", ops="+")
    assert custom[0].prompt == f"Compute {custom[0].meta['a']}+{custom[0].meta['b']}."
    with pytest.raises(DataError, match="unknown operation '/'"):
        arith(ops="*/")
    with pytest.raises(DataError, match="digits: must be at least 1"):
        arith(digits=0)


def test_arith_through_data_config():
    cfg = DataConfig(task="arith", options={"count": 20, "ops": "+"}, template="Q: {prompt}", limit=7)
    examples = load_examples(cfg)
    assert len(examples) == 7 and all(e.prompt.startswith("Q: What is ") for e in examples)
    assert [e.id for e in load_examples(cfg, default_split="test")][0] == "arith-test-0"
    assert task_default_reward(cfg) == ("integer", {"extract": "first_result", "strict": True})
    from upslope.errors import ConfigError

    with pytest.raises(ConfigError, match="data.options.cuont: unknown option for task 'arith'.*'count'"):
        load_examples(DataConfig(task="arith", options={"cuont": 3}))


def test_shared_data_dir_holds_the_datasets():
    root = shared_data_dir()
    for rel in ("gsm8k/test.jsonl", "gsm8k/train.jsonl", "math500/test.jsonl"):
        assert (root / rel).is_file(), root / rel


def test_gsm8k_real_files():
    test = gsm8k(split="test")
    train = gsm8k(split="train")
    assert (len(test), len(train)) == (1319, 7473)
    first = test[0]
    assert first.answer == "18"
    assert first.prompt.startswith("Janet")
    assert first.prompt.endswith("\nPut your final answer after '####'.")
    assert first.meta["solution"].rstrip().endswith("#### 18")
    assert train[0].answer == "72"
    for ex in test + train:  # every reference is the number after '####', separators removed
        assert re.fullmatch(r"-?\d+(\.\d+)?", ex.answer), ex.answer
        assert ex.answer == ex.meta["solution"].split("####")[-1].strip().replace(",", "")
    with_commas = [ex for ex in train if "," in ex.meta["solution"].split("####")[-1]]
    assert with_commas and all("," not in ex.answer for ex in with_commas)
    assert task_default_reward(DataConfig(task="gsm8k")) == ("math", {})


def test_math500_real_file():
    examples = math500()
    assert len(examples) == 500
    assert all(isinstance(e.answer, str) and e.answer for e in examples)
    assert examples[0].answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert examples[0].prompt.endswith("Put your final answer within \\boxed{}.")
    assert {"subject", "level", "solution"} <= set(examples[0].meta)


def test_task_missing_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        gsm8k(path=str(tmp_path / "nope.jsonl"))


# ------------------------------------------------------------------ prompts


def test_encode_prompts_applies_real_chatml_template(tokenizer):
    examples = [Example(prompt="What is 2 * 3?"), Example(prompt="Hi")]
    ids, kept = encode_prompts(examples, tokenizer)
    assert kept == [0, 1]
    default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert tokenizer.decode(ids[0]) == (f"<|im_start|>system\n{default_system}<|im_end|>\n"
                                        "<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n")
    assert ids[0][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # no extra BOS

    ids, _ = encode_prompts(examples[:1], tokenizer, system_prompt="Answer with a number.")
    assert tokenizer.decode(ids[0]) == ("<|im_start|>system\nAnswer with a number.<|im_end|>\n"
                                        "<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n")

    ids, _ = encode_prompts(examples[:1], tokenizer, use_chat_template=False, system_prompt="Sys.")
    assert tokenizer.decode(ids[0]) == "Sys.\n\nWhat is 2 * 3?"


def test_encode_prompts_too_long_names_the_option(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "short", "answer": 1},
                                              {"prompt": "word " * 200, "answer": 2}])
    examples = records_to_examples(read_records(path))
    with pytest.raises(DataError) as info:
        encode_prompts(examples, tokenizer, max_prompt_tokens=64)
    msg = str(info.value)
    assert msg.startswith(f"{path}:2: prompt has ")
    assert "rollout.max_prompt_tokens=64" in msg and "rollout.drop_long_prompts=true" in msg
    ids, kept = encode_prompts(examples, tokenizer, max_prompt_tokens=64, drop_long=True)
    assert kept == [0] and len(ids) == 1 and len(ids[0]) <= 64
