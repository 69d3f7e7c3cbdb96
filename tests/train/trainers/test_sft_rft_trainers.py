"""`upslope sft` and `upslope rft` end to end on the tiny model: two steps each, learning,
exact resume, the recipes, RFT's samples as an SFT dataset, and one-line errors."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from run_helpers import metrics, trained
from safetensors.torch import load_file

from upslope.cli import main
from upslope.config import load_config
from upslope.train.trainers.rft import RFTTrainer
from upslope.train.trainers.sft import SFTTrainer

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "fixtures"
CHAT = FIXTURES / "chat.jsonl"
EVEN = FIXTURES / "offline_rewards.py"
RECIPES = HERE.parents[2] / "recipes"


def tiny(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "train.eval_before=false", "train.eval_after=false",
            "train.micro_batch_tokens=512", "train.eval_every=0", "train.threads=1", *extra]


def sft_args(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return tiny(tiny_model_path, run_dir, f"data.path={CHAT}", "data.messages_field=messages", "sft.batch_size=4",
                *extra)


def rft_args(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return tiny(tiny_model_path, run_dir, "rft.prompts_per_round=4", "rollout.n=4", "rollout.max_new_tokens=6",
                f"reward=[{{name: '{EVEN}:even_length'}}]", "rft.batch_size=4", *extra)


def run(cls, overrides: list[str], recipe: Path | None = None):
    return trained(cls(load_config(recipe, overrides)))



def test_sft_command_runs_two_steps(tiny_model_path, tmp_path):
    out = tmp_path / "sft"
    assert main(["sft", *sft_args(tiny_model_path, out, "train.steps=2")]) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["sft/trained_tokens"] > 0
        assert r["loss"] == pytest.approx(r["nll"], rel=1e-4)  # plain SFT: the loss is the token-mean NLL
    assert rows[1]["sft/epoch"] == pytest.approx(8 / 6)
    assert (out / "checkpoints" / "step_000002" / "model" / "config.json").exists()


def test_sft_learns_and_dft_weights_by_probability(tiny_model_path, tmp_path):
    """SFT drives the NLL of the training replies down (fails if the update does nothing);
    with DFT the loss is the probability-weighted NLL, below the plain NLL."""
    out = tmp_path / "learn"
    run(SFTTrainer, sft_args(tiny_model_path, out, "train.steps=12", "optim.lr=3e-3", "train.precision=float32",
                             "sft.batch_size=6"))
    nll = [r["nll"] for r in metrics(out)]
    assert nll[-1] < 0.5 * nll[0], nll
    out = tmp_path / "dft"
    run(SFTTrainer, sft_args(tiny_model_path, out, "train.steps=1", "sft.dft=true", "sft.batch_size=6"))
    (row,) = metrics(out)
    assert 0 < row["loss"] < row["nll"] and row["token_prob"] < 1e-3


def test_sft_epochs_set_the_steps_and_eval_runs_on_the_task(tiny_model_path, tmp_path):
    """sft.epochs=1 over 6 conversations in batches of 4 is 2 steps; held-out evaluation
    (the engine started only then, with the learner's weights) runs on data.task."""
    out = tmp_path / "epochs"
    trainer = run(SFTTrainer, sft_args(tiny_model_path, out, "sft.epochs=1", "train.eval_after=true",
                                       "eval.limit=4", "data.system_prompt=Be brief."))
    assert trainer.cfg.train.steps == 2 and trainer.updater.scheduler.last_epoch == 2
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2]
    summary = json.loads((out / "eval" / "step2_summary.json").read_text())
    assert summary["prompts"] == 4 and summary["engine"] == "hf"
    sample = json.loads((out / "eval" / "step2_samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("What is") and isinstance(sample["answer"], int)


def test_sft_resume_is_exact(tiny_model_path, tmp_path):
    """sft 2 steps == sft 1 step, stop, resume, 1 step: same weights, same metrics."""
    common = ["train.steps=2", "train.deterministic=true", "train.threads=1", "optim.lr=1e-3", "train.seed=5"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(SFTTrainer, sft_args(tiny_model_path, straight, *common))
    run(SFTTrainer, sft_args(tiny_model_path, split, *common, "train.stop_after=1"))
    run(SFTTrainer, sft_args(tiny_model_path, split, *common, "train.resume=latest"))
    a = load_file(straight / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/") and "per_s" not in k}  # noqa: E731
                          for r in rows]
    assert strip(metrics(straight)) == strip(metrics(split))


@pytest.mark.ci
@pytest.mark.slow  # two sampling rounds: ~6 s
def test_rft_command_runs_two_rounds_and_its_samples_are_an_sft_dataset(tiny_model_path, tmp_path):
    out = tmp_path / "rft"
    assert main(["rft", *rft_args(tiny_model_path, out, "train.steps=2", "rft.epochs=2")]) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    samples = [json.loads(x) for x in (out / "rft_samples.jsonl").read_text().splitlines()]
    for r in rows:
        assert 0 < r["rft/kept"] < 16 and r["rft/kept_frac"] == r["rft/kept"] / 16
        assert r["reward/mean"] >= r["rft/kept_frac"]  # kept <= passing samples (dedupe)
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
        assert sum(s["round"] == r["step"] for s in samples) == r["rft/kept"]
    for s in samples:  # only passing replies, each a chat row of the prompt and the reply
        assert s["reward"] == 1.0 and len(s["messages"][-1]["content"]) % 2 == 0
        assert [m["role"] for m in s["messages"]] == ["user", "assistant"]
        assert s["messages"][0]["content"].startswith("What is ")
    sft_out = tmp_path / "sft_on_rft"
    assert main(["sft", *tiny(tiny_model_path, sft_out, f"data.path={out / 'rft_samples.jsonl'}",
                              "data.messages_field=messages", "train.steps=2", "sft.batch_size=4")]) == 0
    assert len(metrics(sft_out)) == 2


def test_rft_keeps_by_threshold_dedupes_and_caps(tiny_model_path, tmp_path):
    """Threshold 0 keeps every sample (minus duplicates); a cap of 1 keeps one per prompt;
    nothing passing skips the update."""
    out = tmp_path / "all"
    trainer = run(RFTTrainer, rft_args(tiny_model_path, out, "train.steps=1", "rft.threshold=0",
                                       "rft.dedupe=false"))
    assert metrics(out)[0]["rft/kept"] == 16 and trainer.updater.scheduler.last_epoch == 4  # 16 kept / batch 4
    out = tmp_path / "cap"
    run(RFTTrainer, rft_args(tiny_model_path, out, "train.steps=1", "rft.threshold=0", "rft.max_per_prompt=1"))
    (row,) = metrics(out)
    assert row["rft/kept"] == 4 and row["rft/prompts_with_kept"] == 1.0
    out = tmp_path / "none"
    trainer = run(RFTTrainer, rft_args(tiny_model_path, out, "train.steps=1", "rft.threshold=2"))
    (row,) = metrics(out)
    assert row["rft/kept"] == 0 and row["skipped"] == 1.0 and trainer.updater.scheduler.last_epoch == 0


@pytest.mark.ci
@pytest.mark.slow  # two sampling rounds, twice: ~6 s
def test_rft_resume_drops_samples_of_rounds_after_the_checkpoint(tiny_model_path, tmp_path):
    out = tmp_path / "resume"
    common = ["train.steps=2", "train.save_every=1"]
    run(RFTTrainer, rft_args(tiny_model_path, out, *common))
    first = (out / "rft_samples.jsonl").read_text()
    assert {json.loads(x)["round"] for x in first.splitlines()} == {1, 2}
    run(RFTTrainer, rft_args(tiny_model_path, out, *common, "train.resume=" + str(out / "checkpoints" / "step_000001")))
    assert (out / "rft_samples.jsonl").read_text() == first  # round 2 sampled again, its first writing dropped


@pytest.mark.parametrize("recipe, cls", [("sft.yaml", SFTTrainer), ("rft.yaml", RFTTrainer)])
def test_recipes_run_two_steps(recipe, cls, tiny_model_path, tmp_path):
    extra = [f"data.path={CHAT}", "sft.epochs=null", "sft.batch_size=4"] if cls is SFTTrainer else \
        ["rft.prompts_per_round=4", "rollout.n=4", "rollout.max_new_tokens=6", "rft.threshold=0"]
    run(cls, tiny(tiny_model_path, tmp_path, "train.steps=2", *extra), RECIPES / recipe)
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)


@pytest.mark.parametrize("args, expected", [
    (["sft"], "upslope sft needs data.path"),
    (["sft", "data.path=no/such.jsonl"], "no/such.jsonl: data file not found"),
    (["sft", f"data.path={CHAT}", "algo.kl_coef=0.1"], "upslope sft has no KL term"),
    (["sft", f"data.path={CHAT}", "sft.batch_size=0"], "sft.batch_size: Input should be greater than or equal to 1"),
    (["sft", f"data.path={CHAT}", "sft.dtf=true"], "did you mean 'sft.dft'"),
    (["sft", f"data.path={CHAT}", "data.prompt_field=question"],  # (its `messages` rows read without it)
     "chat.jsonl:1: field 'question' missing (data.prompt_field"),
    (["rft", "optim.schedule=cosine"], "upslope rft needs a constant schedule"),
    (["rft", "rft.trheshold=1"], "did you mean 'rft.threshold'"),
])
def test_bad_input_is_one_clear_line(args, expected, tiny_model_path, tmp_path, capsys):
    assert main([*args, f"model.name={tiny_model_path}", f"run_dir={tmp_path}", "log.progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("upslope: error:") and expected in err[0], err
