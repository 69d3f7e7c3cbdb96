"""`upslope train` on data and rewards written for other frameworks, the files untouched: a TRL GRPO
setup (conversational prompt-only JSONL, TRL's batched accuracy reward), verl's (GSM8K-style parquet
schema, compute_score returning a dict), and TRL preference rows with `upslope dpo`; each run two steps
on the tiny model in its own run directory. The reward fixtures check the arguments their framework
would pass, so a run that called them any other way fails on every sample. Also: a held-out set that is
the training data is said in one warning line and logged as eval/train_overlap."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import metrics

from upslope.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FORMATS = Path(__file__).resolve().parents[2] / "fixtures" / "formats"


def tiny(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "train.steps=2", "eval.limit=2", "eval.max_new_tokens=4", "train.threads=1",
            "train.eval_before=false", *extra]



def one_text(out: str) -> str:
    return " ".join(out.split())  # the console wraps long notes


def test_a_trl_grpo_dataset_and_reward_run_unchanged(tiny_model_path, tmp_path, capsys):
    run_dir = tmp_path / "trl"
    reward = f"{FORMATS}/trl_rewards.py"
    status = main(["train", *tiny(tiny_model_path, run_dir, f"data.path={FORMATS / 'trl_conversational_train.jsonl'}",
                                  f"eval.data.path={FORMATS / 'trl_conversational_test.jsonl'}",
                                  f"reward=[{{name: '{reward}:accuracy_reward'}}, {{name: '{reward}:length_reward'}}]")])
    out, err = capsys.readouterr()
    assert status == 0, err
    text = one_text(out)
    assert (f"data: {FORMATS / 'trl_conversational_train.jsonl'} read as TRL conversational prompt-only (detected "
            f"from its columns): data.messages_field=prompt, data.answer_field=solution") in text
    assert "reward 'accuracy_reward': TRL's fn(completions, **columns)" in text
    assert "detected from its signature (completions, solution, **kwargs)" in text
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("reward/accuracy_reward" in r and "reward/length_reward" in r for r in steps)
    assert not any(k.startswith("reward_failures/") for r in steps for k in r)
    summary = json.loads((run_dir / "eval" / "step2_summary.json").read_text())
    assert summary["prompts"] == 2 and "held-out prompts are also training prompts" not in err


def test_a_verl_parquet_and_compute_score_run_unchanged(tiny_model_path, tmp_path, capsys):
    run_dir = tmp_path / "verl"
    status = main(["train", *tiny(tiny_model_path, run_dir, f"data.path={FORMATS / 'verl_train.parquet'}",
                                  f"eval.data.path={FORMATS / 'verl_test.parquet'}",
                                  f"reward=[{{name: '{FORMATS}/verl_reward.py:compute_score'}}]")])
    out, err = capsys.readouterr()
    assert status == 0, err
    text = one_text(out)
    assert "read as verl's schema (detected from its columns): data.messages_field=prompt, " \
           "data.answer_field=reward_model.ground_truth" in text
    assert "reward 'compute_score': verl's compute_score(data_source, solution_str, ground_truth" in text
    steps = [r for r in metrics(run_dir) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all("compute_score/acc" in r for r in steps)
    assert not any(k.startswith("reward_failures/") for r in steps for k in r)
    samples = [json.loads(x) for x in (run_dir / "eval" / "step2_samples.jsonl").read_text().splitlines()]
    assert [s["answer"] for s in samples] == ["9", "40"]  # reward_model.ground_truth of the test rows


def test_trl_preference_rows_with_an_implicit_prompt_train_with_dpo(tiny_model_path, tmp_path, capsys):
    run_dir = tmp_path / "dpo"
    status = main(["dpo", *tiny(tiny_model_path, run_dir, "dpo.source=dataset", "train.eval_after=false",
                                f"dpo.path={FORMATS / 'trl_preference_implicit.jsonl'}", "dpo.pairs_per_step=2")])
    _, err = capsys.readouterr()
    assert status == 0, err
    assert [r["step"] for r in metrics(run_dir) if "loss" in r] == [1, 2]


def test_evaluating_on_the_training_data_is_said_and_logged(tiny_model_path, tmp_path, capsys):
    run_dir = tmp_path / "overlap"
    train = FORMATS / "trl_conversational_train.jsonl"
    status = main(["train", *tiny(tiny_model_path, run_dir, f"data.path={train}", f"eval.data.path={train}",
                                  "train.steps=1", f"reward=[{{name: '{FORMATS}/trl_rewards.py:accuracy_reward'}}]")])
    _, err = capsys.readouterr()
    assert status == 0, err
    assert ("evaluation: all 2 held-out prompts are also training prompts (same prompt and answer), so the "
            "held-out accuracy is measured on training data; set eval.data to a disjoint set") in one_text(err)
    assert [r["eval/train_overlap"] for r in metrics(run_dir) if "eval/accuracy" in r] == [1.0]
