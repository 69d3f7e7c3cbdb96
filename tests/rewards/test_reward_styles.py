"""Reward functions as TRL, verl and OpenRLHF users write them, run unchanged: the calling convention
detected from the signature (the detection table, with the ambiguous and mismatched cases), each
called as its framework calls it (batched keyword arguments and dataset columns for TRL, message lists
for conversational data, None as "does not apply", async functions; verl's per-sample compute_score
and its dict result; OpenRLHF's queries through the chat template), and the check against the data
that runs before the model loads."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from upslope.config import DataConfig, RewardSpec
from upslope.data import load_examples
from upslope.errors import ConfigError, DataError
from upslope.rewards import build_reward_fns, check_rewards, score
from upslope.rewards.context import RewardContext
from upslope.rewards.styles import detect_style

FORMATS = Path(__file__).resolve().parents[1] / "fixtures" / "formats"
TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


def examples(name: str, **data):
    return load_examples(DataConfig(path=str(FORMATS / name), **data))


def metas_for(exs, completions):
    """Per-sample meta as the rollout builds it: the example's columns plus prompt, answer, completion."""
    return [{**ex.meta, "answer": ex.answer, "prompt": ex.prompt, "completion": c, "example_id": ex.id}
            for ex, c in zip(exs, completions)]


def reward(ref: str, exs=None, style: str = "auto", context=None):
    [rf] = build_reward_fns([RewardSpec(name=ref, style=style)], context=context)
    if exs is not None:
        check_rewards([rf], exs)
    return rf


# ------------------------------------------------------------------ the detection table


def trl_kwargs_only(**kwargs): ...
def both_trl_and_verl(completions, solution_str): ...
def two_positional(completion, answer): ...
def no_arguments(): ...
def upslope_with_option(completion, answer, meta, *, scale=1.0): ...
def openrlhf(queries, prompts, labels): ...
def upslope_batched(completions, answers, metas): ...


@pytest.mark.parametrize("fn, style", [
    (trl_kwargs_only, "trl"), (openrlhf, "openrlhf"), (upslope_with_option, "upslope"), (upslope_batched, "batched"),
])
def test_detection_table_of_signatures(fn, style):
    assert detect_style(fn, fn.__name__, "reward[0]") == style


@pytest.mark.parametrize("ref, style, note", [
    ("trl_rewards.py:accuracy_reward", "trl", "TRL's fn(completions, **columns)"),
    ("trl_rewards.py:async_accuracy", "trl", "detected from its signature (completions, solution, **kwargs)"),
    ("verl_reward.py:compute_score", "verl", "verl's compute_score(data_source, solution_str, ground_truth"),
    ("openrlhf_reward.py:reward_func", "openrlhf", "OpenRLHF's reward_func(queries, prompts, labels)"),
])
def test_detected_files_say_how_they_are_called(ref, style, note):
    rf = reward(f"{FORMATS / ref}")
    assert rf.batched and rf.fn.style == style and note in rf.note and rf.note.startswith("reward '")
    assert "\n" not in rf.note


def test_the_upslope_form_is_detected_and_called_per_sample():
    rf = reward(f"{TOY}:long_text")
    assert not rf.batched and rf.note == ("reward 'long_text': upslope's per-sample form; detected from its "
                                          "signature (completion: str, answer, meta) -> float")


@pytest.mark.parametrize("fn, message", [
    (both_trl_and_verl, "signature (completions, solution_str) fits both the verl and trl forms"),
    (two_positional, "signature (completion, answer) fits none of the accepted forms"),
    (no_arguments, "signature () fits none of the accepted forms"),
])
def test_ambiguous_and_unfit_signatures_are_one_line_naming_the_forms(fn, message):
    with pytest.raises(ConfigError) as info:
        detect_style(fn, fn.__name__, "reward[2]")
    text = str(info.value)
    assert message in text and "name the form with reward[2].style" in text and "\n" not in text
    for form in ("fn(completion, answer, meta)", "TRL's fn(completions, **columns)", "verl's compute_score(",
                 "OpenRLHF's reward_func(queries, prompts, labels)"):
        assert form in text


def test_a_style_set_by_hand_is_used_and_checked(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def batch_reward(completions, answers, metas):\n"
                    "    return [float(str(a) in c) for c, a in zip(completions, answers)]\n"
                    "def two(completion, answer):\n    return 1.0\n")
    rf = reward(f"{path}:batch_reward", style="batched")
    assert rf.note.endswith("set by reward[0].style")
    exs = examples("trl_standard.jsonl")
    assert score([rf], ["24", "no"], [e.answer for e in exs[:2]], metas_for(exs[:2], ["24", "no"])).components == {
        "batch_reward": [1.0, 0.0]}
    with pytest.raises(ConfigError, match="reward 'two': signature \\(completion, answer\\) cannot take the upslope"):
        reward(f"{path}:two", style="upslope")
    with pytest.raises(ConfigError, match="reward\\[0\\].style=trl: a calling convention is chosen for user functions"):
        build_reward_fns([RewardSpec(name="integer", style="trl")])


# ------------------------------------------------------------------ TRL


def test_trl_conversational_rewards_get_message_lists_columns_and_ids():
    exs = examples("trl_conversational_train.jsonl")[:3]
    rf = reward(f"{FORMATS}/trl_rewards.py:accuracy_reward", exs, context=RewardContext(step=3, total_steps=10))
    comps = ["24", "The answer is 54.", "I do not know"]
    got = score([rf], comps, [e.answer for e in exs], metas_for(exs, comps), token_ids=[[1], [2, 3], [4]])
    assert got.components == {"accuracy_reward": [1.0, 1.0, 0.0]} and not got.failures


def test_trl_standard_rewards_get_strings_and_prompts_as_text():
    exs = examples("trl_standard.jsonl")[:2]
    rf = reward(f"{FORMATS}/trl_rewards.py:standard_accuracy", exs)
    got = score([rf], ["24", "0"], [e.answer for e in exs], metas_for(exs, ["24", "0"]), token_ids=[[5], [6]])
    assert got.components == {"standard_accuracy": [1.0, 0.0]} and not got.failures


def test_trl_none_means_not_applicable_and_async_functions_are_awaited():
    exs = examples("trl_conversational_train.jsonl")[3:7]  # solutions 16, 63, 20, 6
    answers = [e.answer for e in exs]
    comps = [str(a) for a in answers]
    rf = reward(f"{FORMATS}/trl_rewards.py:only_even_products", exs)
    got = score([rf], comps, answers, metas_for(exs, comps), token_ids=[[0]] * 4)
    assert answers == ["16", "63", "20", "6"] and got.not_applicable == {"only_even_products": 1}
    assert got.components["only_even_products"] == [1.0, 0.0, 1.0, 1.0] and not got.failures
    rf = reward(f"{FORMATS}/trl_rewards.py:async_accuracy", exs)
    assert score([rf], comps, answers, metas_for(exs, comps)).components == {"async_accuracy": [1.0] * 4}


@pytest.mark.parametrize("name, message", [
    ("needs_difficulty", "reward 'needs_difficulty' (trl form) takes 'difficulty', which the data does not supply "
                         "(columns: solution)"),
    ("returns_one_number", "reward 'returns_one_number' (TRL's fn(completions, **columns)"),
    ("reads_missing_column", "reward 'reads_missing_column' reads column 'reference', which the data lacks "
                             "(columns: solution)"),
])
def test_trl_mismatches_are_one_line_naming_the_row_before_any_sampling(name, message):
    exs = examples("trl_conversational_train.jsonl")
    with pytest.raises(DataError) as info:
        reward(f"{FORMATS}/trl_rewards.py:{name}", exs)
    text = str(info.value)
    assert text.startswith(f"{FORMATS / 'trl_conversational_train.jsonl'}:1: ") and message in text
    assert "\n" not in text


# ------------------------------------------------------------------ verl and OpenRLHF


def test_verl_compute_score_gets_its_arguments_and_its_dict_is_unpacked():
    exs = examples("verl_train.parquet")[:2]
    rf = reward(f"{FORMATS}/verl_reward.py:compute_score", exs)
    comps = ["4 times 6 is 24", "no idea"]
    metas = metas_for(exs, comps)
    got = score([rf], comps, [e.answer for e in exs], metas)
    assert got.components == {"compute_score": [1.0, 0.0]} and not got.failures
    assert [m["metrics"] for m in metas] == [{"compute_score/acc": 1.0}, {"compute_score/acc": 0.0}]
    rf = reward(f"{FORMATS}/verl_reward.py:length_score", exs)
    assert math.isclose(score([rf], ["ab"], [exs[0].answer], metas_for(exs, ["ab"])).components["length_score"][0],
                        1 - 2 / 64)


def test_a_verl_dict_without_a_score_is_one_line():
    with pytest.raises(DataError, match="reward 'no_score_key' \\(verl's compute_score.*returned a dict without "
                                        "'score' \\(keys: reward\\)"):
        reward(f"{FORMATS}/verl_reward.py:no_score_key", examples("verl_train.parquet"))


def test_openrlhf_reward_gets_templated_queries_prompts_and_labels(tokenizer):
    exs = examples("trl_conversational_train.jsonl")[:2]
    rf = reward(f"{FORMATS}/openrlhf_reward.py:reward_func", exs, context=RewardContext(policy_tokenizer=tokenizer))
    comps = ["24", "7"]
    got = score([rf], comps, [e.answer for e in exs], metas_for(exs, comps))
    assert got.components == {"reward_func": [1.0, 0.0]}
    prompt = rf.fn._prompt_text(exs[0].prompt)
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
