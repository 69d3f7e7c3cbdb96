"""The bad-input catalog (tests/test_bad_inputs.py holds the promise and the harness) for data, rewards
and trackers brought from other frameworks: a reward whose signature fits no calling convention or
several, a TRL/verl reward that does not fit the data (a column it takes or reads that the data lacks, a
result of the wrong shape), nested fields, splits a folder or task does not have, a Hub id without a Hub,
JSON arrays and CSV files that do not parse, preference rows without a prompt, and trackers that are
unknown, misconfigured or not installed. Each is one line before the model loads."""
from __future__ import annotations

import json
from pathlib import Path

from bad_input_helpers import Case, World, catalog_tests, registrar

CASES: list[Case] = []
case = registrar(CASES)
F = Path(__file__).resolve().parent / "fixtures" / "formats"
TRL_DATA = f"data.path={F / 'trl_conversational_train.jsonl'}"
VERL_DATA = f"data.path={F / 'verl_train.parquet'}"


def _train(w: World, *extra: str) -> list[str]:
    return ["train", *w.base(None, *extra)]


def _reward(ref: str, style: str | None = None) -> str:
    return f"reward=[{{name: '{ref}'" + (f", style: {style}" if style else "") + "}]"


# ---------------------------------------------------------------- calling conventions

case("reward_signature_fits_no_form", ["reward 'score': signature (completion, answer) fits none of the accepted "
                                       "forms", "name the form with reward[0].style"])(
    lambda w: _train(w, _reward(f"{w.file('two.py', 'def score(completion, answer):' + chr(10) + '    return 1.0')}"
                                f":score")))
case("reward_signature_fits_two_forms", ["signature (completions, solution_str) fits both the verl and trl forms"])(
    lambda w: _train(w, _reward(f"{w.file('both.py', 'def f(completions, solution_str):' + chr(10) + '    return 1')}"
                                f":f")))
case("reward_style_unknown", ["reward[0].style", "'trl'"])(lambda w: _train(w, "reward=[{name: integer, style: trlx}]"))
case("reward_style_on_a_registered_reward", ["reward[0].style=trl", "'integer' is a registered reward"])(
    lambda w: _train(w, "reward=[{name: integer, style: trl}]"))
case("reward_style_that_does_not_fit", [f"{F / 'trl_conversational_train.jsonl'}:1",
                                        "reward 'accuracy_reward' (verl form) takes 'completions'"])(
    lambda w: _train(w, TRL_DATA, _reward(f"{F}/trl_rewards.py:accuracy_reward", "verl")))

# ---------------------------------------------------------------- rewards that do not fit the data

case("trl_reward_column_missing", [f"{F / 'trl_conversational_train.jsonl'}:1", "takes 'difficulty', which the data "
                                   "does not supply (columns: solution)"])(
    lambda w: _train(w, TRL_DATA, _reward(f"{F}/trl_rewards.py:needs_difficulty")))
case("trl_reward_reads_a_missing_column", ["reads column 'reference', which the data lacks"])(
    lambda w: _train(w, TRL_DATA, _reward(f"{F}/trl_rewards.py:reads_missing_column")))
case("trl_reward_returns_a_number", [f"{F / 'trl_conversational_train.jsonl'}:1", "returned float 1.0",
                                     "expected a list of 1 values"])(
    lambda w: _train(w, TRL_DATA, _reward(f"{F}/trl_rewards.py:returns_one_number")))
case("verl_reward_dict_without_score", [f"{F / 'verl_train.parquet'}:row 1", "returned a dict without 'score'"])(
    lambda w: _train(w, VERL_DATA, _reward(f"{F}/verl_reward.py:no_score_key")))

# ---------------------------------------------------------------- data

case("data_nested_field_missing", [f"{F / 'verl_train.parquet'}:row 1", "field 'reward_model.truth' missing",
                                   "fields of 'reward_model' here: style, ground_truth"])(
    lambda w: _train(w, VERL_DATA, "data.answer_field=reward_model.truth", "reward=[{name: integer}]"))
case("data_folder_split_missing", [f"{F / 'hub_layout'}: no split 'validation' (has: train, test)"])(
    lambda w: _train(w, f"data.path={F / 'hub_layout'}", "data.split=validation", "reward=[{name: integer}]"))
case("eval_folder_split_missing", lambda w: [f"{w.tmp / 'nosplits'}: no split 'test' (has: train)"])(
    lambda w: _train(w, f"eval.data.path={w.file('nosplits/rows.jsonl', json.dumps({'prompt': 'p', 'answer': 1})).parent}",
                     "eval.data.split=test", "reward=[{name: integer}]"))
case("data_task_split_missing", ["data.split='train': task 'math500' has only the split(s) test"])(
    lambda w: _train(w, "data.task=math500", "data.split=train", "data.options={}"))
case("data_hub_id_without_a_hub", ["data.path=upslope-tests/no-such-dataset: no such local file or directory",
                                   "Hugging Face Hub could not be asked"])(
    lambda w: _train(w, "data.path=upslope-tests/no-such-dataset", "reward=[{name: integer}]"))
case("data_json_array_item_not_object", lambda w: [f"{w.tmp / 'rows.json'}: item 2: expected a JSON object, got int"])(
    lambda w: _train(w, f"data.path={w.file('rows.json', json.dumps([{'prompt': 'p', 'answer': 1}, 3]))}",
                     "reward=[{name: integer}]"))
case("data_csv_ragged", lambda w: [str(w.tmp / "rows.csv"), "not a valid CSV file"])(
    lambda w: _train(w, f"data.path={w.file('rows.csv', 'prompt,answer' + chr(10) + 'a,1' + chr(10) + 'b,2,3')}",
                     "reward=[{name: integer}]"))
case("dpo_pairs_without_a_shared_prompt", lambda w: [f"{w.tmp / 'p.jsonl'}:1", "share no opening"])(
    lambda w: ["dpo", *w.base(None, "dpo.source=dataset",
                              f"dpo.path={w.file('p.jsonl', json.dumps({'chosen': 'Yes.', 'rejected': 'No.'}))}")])

# ---------------------------------------------------------------- trackers

case("tracker_unknown", ["log.trackers[0].name: unknown tracker 'wandbb' (did you mean 'wandb'?)"])(
    lambda w: _train(w, "log.trackers=[wandbb]"))
case("tracker_option_unknown", ["log.trackers[0].options.experimnt: unknown option for tracker 'mlflow'",
                                "did you mean 'experiment'"])(
    lambda w: _train(w, "log.trackers=[{name: mlflow, options: {experimnt: x}}]"))
case("tracker_not_installed", ["log.trackers[0]: tracker 'byo_missing_tracker' needs the no_such_tracker_pkg_xyz "
                               "package, which is not installed"])(
    lambda w: _train(w, f"plugins=[{F / 'missing_tracker.py'}]", "log.trackers=[byo_missing_tracker]"))


# ---------------------------------------------------------------- the harness


world_base, test_bad_input_gives_one_line = catalog_tests(CASES, "bad-inputs-byo")
