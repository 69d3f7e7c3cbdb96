"""Datasets as TRL, verl, SkyRL and Hugging Face `datasets` users write them: the layout detected from
the columns (the detection table), nested fields, JSON arrays and CSV files read as `datasets` reads
them, dataset folders split by file name, Hub ids without a Hub, preference rows with an implicit
prompt, and splits that are honoured or refused (never ignored) with the train/eval overlap counted."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from upslope.config import Config, DataConfig, DPOConfig
from upslope.data import has_split, load_examples, overlap
from upslope.data.pairs import load_pairs
from upslope.data.sources import read_records, records_to_examples
from upslope.errors import ConfigError, DataError
from upslope.eval.runner import eval_data_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FORMATS = Path(__file__).resolve().parents[1] / "fixtures" / "formats"
PRODUCT = "What is {} * {}? Answer with the number only."


# ------------------------------------------------------------------ the detection table

TABLE = [  # file, layout named in the note, options detection set, is the prompt a chat?, first answer
    ("trl_conversational_train.jsonl", "TRL conversational prompt-only",
     ["data.messages_field=prompt", "data.answer_field=solution"], True, "24"),
    ("trl_standard.jsonl", "TRL standard prompt-only", ["data.answer_field=solution"], False, "24"),
    ("trl_messages.jsonl", "TRL conversational language modeling", ["data.messages_field=messages"], True, "24"),
    ("verl_train.parquet", "verl's schema", ["data.messages_field=prompt", "data.answer_field=reward_model.ground_truth"],
     True, "24"),
    ("skyrl.jsonl", "SkyRL's schema", ["data.messages_field=prompt", "data.answer_field=reward_spec.ground_truth"],
     True, "24"),
    ("hub_layout", "prompt and answer columns", ["data.prompt_field=question"], False, "24"),
    ("rows_array.json", None, [], False, 24),
    ("rows.csv", None, [], False, 24),
]


@pytest.mark.parametrize("name, layout, detected, chat, answer", TABLE, ids=[row[0] for row in TABLE])
def test_detection_table(name, layout, detected, chat, answer):
    notes: list[str] = []
    examples = load_examples(DataConfig(path=str(FORMATS / name)), announce=notes.append)
    assert isinstance(examples[0].prompt, list) == chat and examples[0].answer == answer
    text = examples[0].prompt[-1]["content"] if chat else examples[0].prompt
    assert text == PRODUCT.format(4, 6)
    if layout is None:
        assert notes == []  # nothing to detect: the config's mapping read it
    else:
        assert notes == [f"data: {FORMATS / name} read as {layout} (detected from its columns): {', '.join(detected)}"]


def test_every_column_rides_along_and_nested_fields_read_by_dotted_path():
    [ex, *_] = load_examples(DataConfig(path=str(FORMATS / "verl_train.parquet")))
    assert ex.meta["data_source"] == "products" and ex.meta["extra_info"]["a"] == 4
    assert ex.meta["reward_model"] == {"style": "rule", "ground_truth": "24"} and "prompt" not in ex.meta
    [ex, *_] = load_examples(DataConfig(path=str(FORMATS / "verl_train.parquet"), answer_field="extra_info.b"))
    assert ex.answer == 6  # a field the user set is read as given (the prompt is still detected)


def test_a_mapping_the_user_set_is_never_overridden():
    with pytest.raises(DataError, match="field 'solutions' missing"):
        load_examples(DataConfig(path=str(FORMATS / "trl_standard.jsonl"), answer_field="solutions"))
    with pytest.raises(DataError, match="field 'question' missing"):
        load_examples(DataConfig(path=str(FORMATS / "trl_conversational_train.jsonl"), prompt_field="question"))


def test_a_missing_nested_field_names_the_fields_beside_it():
    where = f"{FORMATS / 'verl_train.parquet'}:row 1"
    with pytest.raises(DataError) as info:
        load_examples(DataConfig(path=str(FORMATS / "verl_train.parquet"), answer_field="reward_model.truth"))
    assert str(info.value) == (f"{where}: field 'reward_model.truth' missing (data.answer_field; fields of "
                               f"'reward_model' here: style, ground_truth); set data.answer_field=null for prompts without answers")


def test_prompt_completion_rows_need_an_answer_or_none():
    path = str(FORMATS / "trl_prompt_completion.jsonl")
    with pytest.raises(DataError, match="field 'answer' missing .*data.answer_field=null"):
        load_examples(DataConfig(path=path))
    [ex, *_] = load_examples(DataConfig(path=path, answer_field=None))
    assert ex.answer is None and ex.meta["completion"][0]["content"] == "24"


# ------------------------------------------------------------------ files as `datasets` reads them


@pytest.mark.parametrize("name, builder", [("rows_array.json", "json"), ("rows.csv", "csv"),
                                           ("trl_conversational_train.jsonl", "json"),
                                           ("verl_train.parquet", "parquet")])
def test_files_read_the_rows_datasets_load_dataset_reads(name, builder, tmp_path):
    import datasets

    ours = [rec for _, rec in read_records(FORMATS / name)]
    theirs = list(datasets.load_dataset(builder, data_files=str(FORMATS / name), split="train",
                                        cache_dir=str(tmp_path)))
    assert ours == theirs and len(ours) >= 5


def test_json_array_and_json_lines_are_both_read_from_a_json_file(tmp_path):
    rows = [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "array.json").write_text("\n  " + json.dumps(rows))
    assert [r for _, r in read_records(tmp_path / "lines.json")] == rows
    got = list(read_records(tmp_path / "array.json"))
    assert [r for _, r in got] == rows and got[1][0] == f"{tmp_path / 'array.json'}:item 2"
    (tmp_path / "bad.json").write_text(json.dumps([rows[0], 3]))
    with pytest.raises(DataError, match=f"{tmp_path / 'bad.json'}: item 2: expected a JSON object, got int"):
        list(read_records(tmp_path / "bad.json"))
    (tmp_path / "cut.json").write_text('[\n{"prompt": "a",\n')
    with pytest.raises(DataError, match=f"{tmp_path / 'cut.json'}:3: invalid JSON"):
        list(read_records(tmp_path / "cut.json"))


def test_csv_columns_keep_their_types_and_a_bad_csv_is_one_line(tmp_path):
    [ex, *_] = records_to_examples(read_records(FORMATS / "rows.csv"))
    assert ex.answer == 24 and ex.meta["source"] == f"{FORMATS / 'rows.csv'}:row 1"
    (tmp_path / "ragged.csv").write_text("prompt,answer\na,1\nb,2,3\n")
    with pytest.raises(DataError, match="ragged.csv: not a valid CSV file"):
        list(read_records(tmp_path / "ragged.csv"))


# ------------------------------------------------------------------ folders, saved datasets, Hub ids


def test_a_hub_layout_folder_is_split_as_datasets_splits_it(tmp_path):
    import datasets

    folder = FORMATS / "hub_layout"
    for split in ("train", "test"):
        ours = [rec for _, rec in read_records(folder, split)]
        assert ours == list(datasets.load_dataset(str(folder), split=split, cache_dir=str(tmp_path)))
    assert len(list(read_records(folder))) == 24  # no split asked: train
    with pytest.raises(DataError, match=r"hub_layout: no split 'validation' \(has: train, test\); a file's or "
                                        r"folder's name gives its split"):
        list(read_records(folder, "validation"))


def test_a_folder_without_split_names_is_one_train_split_and_test_is_refused(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": "p", "answer": 1}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"prompt": "q", "answer": 2}) + "\n")
    assert len(list(read_records(tmp_path))) == 2
    with pytest.raises(DataError, match=r"no split 'test' \(has: train\)"):  # never every file silently
        list(read_records(tmp_path, "test"))
    cfg = Config(data=DataConfig(path=str(tmp_path)))
    assert not has_split(cfg.data, "test") and eval_data_config(cfg).split is None  # evaluation: the training data


def test_a_saved_dataset_without_splits_refuses_a_split(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "p", "answer": 1}]).save_to_disk(str(tmp_path / "flat"))
    assert len(list(read_records(tmp_path / "flat"))) == 1
    with pytest.raises(DataError, match="a saved dataset with no splits; data.split='test' cannot be honoured"):
        list(read_records(tmp_path / "flat", "test"))


def test_a_hub_id_without_a_hub_is_one_line_and_quick():
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        load_examples(DataConfig(path="upslope-tests/no-such-dataset", subset="main"))
    msg = str(info.value)
    assert msg.startswith("data.path=upslope-tests/no-such-dataset: no such local file or directory, and the "
                          "Hugging Face Hub could not be asked") and "\n" not in msg
    assert time.monotonic() - start < 30
    with pytest.raises(DataError, match="/no/such/file.jsonl: data file not found"):  # a path is not a Hub id
        load_examples(DataConfig(path="/no/such/file.jsonl"))


# ------------------------------------------------------------------ splits of tasks, train/eval overlap


def test_competition_tasks_have_only_a_test_split_and_say_so():
    with pytest.raises(ConfigError, match="data.split='train': task 'math500' has only the split\\(s\\) test"):
        load_examples(DataConfig(task="math500", split="train"))
    cfg = Config(data=DataConfig(task="math500"))
    train = load_examples(cfg.data, "train")  # training reads the only split...
    held_out = load_examples(eval_data_config(cfg), "test")
    assert overlap(train, held_out) == len(held_out) == 500  # ...and the loop reports the overlap
    with pytest.raises(ConfigError, match="task 'arith' has only the split\\(s\\) train, test"):
        load_examples(DataConfig(task="arith", split="validation"))


def test_held_out_split_replaces_a_split_given_as_the_tasks_option():
    cfg = Config(data=DataConfig(task="gsm8k", options={"split": "train"}))
    train = load_examples(cfg.data, "train")
    held = eval_data_config(cfg)
    assert cfg.data.split == "train" and "split" not in cfg.data.options  # the option is the section's split
    assert held.split == "test"
    with pytest.raises(ValueError, match="disagree"):
        DataConfig(task="gsm8k", split="test", options={"split": "train"})
    assert overlap(train, load_examples(held, "test")) == 0


def test_overlap_counts_the_same_problem_from_two_sources():
    trl = load_examples(DataConfig(path=str(FORMATS / "trl_conversational_train.jsonl")))
    verl = load_examples(DataConfig(path=str(FORMATS / "verl_train.parquet")))
    test = load_examples(DataConfig(path=str(FORMATS / "verl_test.parquet")))
    assert overlap(trl, verl) == 24 and overlap(verl, test) == 0


# ------------------------------------------------------------------ preference rows


@pytest.mark.parametrize("name, prompt, chosen, rejected", [
    ("trl_preference.jsonl", [{"role": "user", "content": PRODUCT.format(4, 6)}], "24", "25"),
    ("trl_preference_implicit.jsonl", [{"role": "user", "content": PRODUCT.format(4, 6)}], "24", "23"),
    ("trl_preference_implicit_standard.jsonl", "4 times 6 is", " 24.", " 26."),
])
def test_preference_rows_with_explicit_and_implicit_prompts(name, prompt, chosen, rejected):
    [pair, *_] = load_pairs(DPOConfig(source="dataset", path=str(FORMATS / name)))
    assert (pair.prompt.prompt, pair.chosen, pair.rejected) == (prompt, chosen, rejected)


def test_an_implicit_prompt_needs_a_shared_opening(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"chosen": "Yes.", "rejected": "No."}) + "\n")
    with pytest.raises(DataError, match="p.jsonl:1: no 'prompt' field, and 'chosen' and 'rejected' share no opening"):
        load_pairs(DPOConfig(source="dataset", path=str(tmp_path / "p.jsonl")))


# ------------------------------------------------------------------ SFT rows in TRL's layouts


@pytest.mark.parametrize("name, first", [
    ("trl_prompt_completion.jsonl", [{"role": "user", "content": PRODUCT.format(4, 6)}, {"role": "assistant", "content": "24"}]),
    ("trl_messages.jsonl", [{"role": "user", "content": PRODUCT.format(4, 6)}, {"role": "assistant", "content": "24"}]),
])
def test_sft_reads_trl_conversational_layouts(name, first):
    from upslope.data.sft import load_conversations

    [conv, *_] = load_conversations(DataConfig(path=str(FORMATS / name)), "response")
    assert conv.messages == first and "completion" not in conv.meta and "prompt" not in conv.meta


def test_sft_reads_trl_standard_prompt_completion(tmp_path):
    from upslope.data.sft import load_conversations

    (tmp_path / "pc.jsonl").write_text(json.dumps({"prompt": "The sky is", "completion": " blue."}) + "\n")
    [conv] = load_conversations(DataConfig(path=str(tmp_path / "pc.jsonl")), "response")
    assert conv.messages == [{"role": "user", "content": "The sky is"}, {"role": "assistant", "content": " blue."}]
