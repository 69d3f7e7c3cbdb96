"""data.task=reasoning_gym with the real reasoning-gym package: seeded splits whose test split shares no
question with train, the generator's own verifier as the reward, bad names and configs as one line, and
a 2-step training run on the tiny model through the command line."""
from __future__ import annotations


import pytest
from run_helpers import metrics

pytest.importorskip("reasoning_gym")

from upslope.cli import main  # noqa: E402
from upslope.config import load_config  # noqa: E402
from upslope.data import load_examples  # noqa: E402
from upslope.data.reasoning_gym import reasoning_gym_task  # noqa: E402
from upslope.errors import ConfigError  # noqa: E402
from upslope.rewards.reasoning_gym import final_number, reasoning_gym_reward  # noqa: E402


def test_splits_are_seeded_and_the_test_split_is_held_out():
    train = reasoning_gym_task(split="train", dataset="leg_counting", size=200, seed=3)
    again = reasoning_gym_task(split="train", dataset="leg_counting", size=200, seed=3)
    assert [e.prompt for e in train] == [e.prompt for e in again] and len(train) == 200
    # basic_arithmetic repeats small questions across seeds: the test split drops those
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    tr = reasoning_gym_task(split="train", dataset="basic_arithmetic", size=300, config=small)
    te = reasoning_gym_task(split="test", dataset="basic_arithmetic", size=300, test_size=100, config=small)
    questions = {e.meta["reasoning_gym"]["entry"]["question"] for e in tr}
    assert 0 < len(te) < 100 and not any(e.meta["reasoning_gym"]["entry"]["question"] in questions for e in te)
    assert te[0].id == "rg-basic_arithmetic-test-0" and "<answer>" in te[0].prompt


def test_the_generators_verifier_is_the_reward():
    [ex] = reasoning_gym_task(split="test", dataset="leg_counting", size=20, test_size=1)
    right, wrong = str(ex.answer), str(int(ex.answer) + 1)
    assert reasoning_gym_reward(f"Counting... <answer>{right}</answer>", ex.answer, ex.meta) == 1.0
    assert reasoning_gym_reward(f"<answer>{wrong}</answer>", ex.answer, ex.meta) == 0.0
    assert reasoning_gym_reward(f"The total is\n{right}", ex.answer, ex.meta) == 0.0  # no tags
    assert reasoning_gym_reward(f"The total is\n{right}", ex.answer, ex.meta, extract="tag_or_last_line") == 1.0
    # a reply prefilled with "<answer>" (data.options.prefill): the answer is what comes before the closing tag
    assert reasoning_gym_reward(f" {right}</answer> because ...", ex.answer, ex.meta, extract="first_line") == 1.0
    assert reasoning_gym_reward(f"{wrong}\n{right}", ex.answer, ex.meta, extract="first_line") == 0.0
    # a generator with its own scoring: word_sorting compares the sorted list, not the text
    [ws] = reasoning_gym_task(split="test", dataset="word_sorting", size=20, test_size=1)
    assert reasoning_gym_reward(f"<answer>{ws.answer}</answer>", ws.answer, ws.meta) == 1.0


@pytest.mark.parametrize("completion, number", [
    ("3 + 8 = 11\n\nThe answer is 11", "11"),
    ("Step 1: 26 + 7 = 33.\nStep 2: check.\nAnswer: **33**.", "33"),
    ("Answer: 3 + 4 = 7", "7"),  # the answer line's own working: after its last "="
    ("So the final answer is: 1,234 legs.", "1234"),  # thousands separators dropped, the unit left
    ("To answer this, add 3 and 4.\n3 + 4 = 7. So 7 legs in 2 groups", "7"),  # no "answer is"/":": after the last "="
    ("We get 5, then 6", "6"),  # neither: the last number
    ("1 - 7 = -6", "-6"), ("so 10-3 is", "3"),  # a minus sign after a digit is the operator
    ("Answer: X", None), ("no number at all", None),
    ("The answer is 12.\nAnswer: 15", "15"),  # the last answer phrase wins
])
def test_final_number_reads_the_number_a_worked_reply_ends_on(completion, number):
    assert final_number(completion) == number


def test_final_number_extract_scores_worked_replies():
    [ex] = reasoning_gym_task(split="test", dataset="leg_counting", size=20, test_size=1)
    right, wrong = str(ex.answer), str(int(ex.answer) + 1)
    worked = f"Each animal has some legs.\n2 + 2 = {wrong}\nAnswer: {right}"
    assert reasoning_gym_reward(worked, ex.answer, ex.meta, extract="final_number") == 1.0
    assert reasoning_gym_reward(worked, ex.answer, ex.meta) == 0.0  # no tags: the default extract reads nothing
    assert reasoning_gym_reward(f"so it is {wrong}", ex.answer, ex.meta, extract="final_number") == 0.0
    # a tag, where the reply has one, is read before any number
    assert reasoning_gym_reward(f"<answer>{right}</answer> not {wrong}", ex.answer, ex.meta, extract="final_number") == 1.0
    assert reasoning_gym_reward("no number", ex.answer, ex.meta, extract="final_number") == 0.0


def test_bad_generator_names_and_configs_are_one_line():
    with pytest.raises(ConfigError, match="no generator 'leg_countin'.*did you mean 'leg_counting'"):
        reasoning_gym_task(dataset="leg_countin")
    with pytest.raises(ConfigError, match="data.options.config: reasoning-gym's 'leg_counting' refuses it"):
        reasoning_gym_task(dataset="leg_counting", config={"no_such_field": 1})


def test_config_defaults_and_a_training_run(tmp_path, tiny_model_path):
    cfg = load_config(None, ["data.task=reasoning_gym", "data.options={dataset: count_bits, size: 50}",
                             f"run_dir={tmp_path}"])
    assert cfg.rollout.max_new_tokens == 256
    assert load_examples(cfg.data, "train")[0].id == "rg-count_bits-train-0"
    run = tmp_path / "run"
    status = main(["train", "data.task=reasoning_gym", "data.options={dataset: count_bits, size: 50, test_size: 8}",
                   f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}", "train.steps=2",
                   "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8", "eval.limit=4",
                   "log.progress=false", "log.plot=false", "log.tensorboard=false"])
    assert status == 0
    rows = metrics(run)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert all("reward/reasoning_gym" in r for r in rows if "loss" in r)
    assert any("eval/accuracy" in r for r in rows)
