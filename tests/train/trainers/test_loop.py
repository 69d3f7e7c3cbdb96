"""The training loop end to end on a tiny model: learning, exact resume, crash-safe
checkpoints, and one-line errors for bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from run_helpers import learning, metrics, trained
from safetensors.torch import load_file

from upslope.cli import main
from upslope.config import load_config
from upslope.train.trainers.rl import Trainer

HERE = Path(__file__).resolve().parent
TOY = HERE.parents[1] / "fixtures" / "toy_rewards.py"


def tiny_overrides(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=8",
            "train.eval_before=false", "train.eval_after=false", "train.micro_batch_tokens=512", *extra]


def run_trainer(overrides: list[str]) -> Trainer:
    return trained(Trainer(load_config(None, overrides)))



def test_tiny_model_learns_a_toy_reward(tiny_model_path, tmp_path):
    """GRPO must raise a learnable reward; the test fails if the reward does not rise."""
    run = tmp_path / "learn"
    run_trainer(tiny_overrides(tiny_model_path, run, "train.steps=10", "optim.lr=3e-2", "rollout.n=8",
                               f"reward=[{{name: '{TOY}:long_text'}}]", "train.precision=float32"))
    rewards = [m["reward/mean"] for m in metrics(run)]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first * 1.5, f"reward did not rise: {rewards}"


def test_resume_at_the_last_step_finishes_the_final_evaluation(tiny_model_path, tmp_path):
    """A run killed after its last checkpoint, during its final evaluation, resumes into that
    evaluation only; without a final evaluation there is nothing to resume (one error)."""
    run = tmp_path / "final"
    common = ["train.steps=2", "train.threads=1", "eval.limit=4", f"reward=[{{name: '{TOY}:long_text'}}]"]
    run_trainer(tiny_overrides(tiny_model_path, run, *common))  # no final evaluation: as if killed there
    assert not any("eval/accuracy" in m for m in metrics(run))
    weights = (run / "checkpoints" / "step_000002" / "model" / "model.safetensors").read_bytes()
    trainer = run_trainer(tiny_overrides(tiny_model_path, run, *common, "train.resume=latest", "train.eval_after=true"))
    assert trainer.start_step == 2
    rows = metrics(run)
    assert [m["step"] for m in rows if "eval/accuracy" in m] == [2] and len([m for m in rows if "loss" in m]) == 2
    assert (run / "checkpoints" / "step_000002" / "model" / "model.safetensors").read_bytes() == weights
    assert main(["train", *tiny_overrides(tiny_model_path, run, *common, "train.resume=latest")]) == 2


@pytest.mark.parametrize("algo", [pytest.param([], id="grpo"),
                                  pytest.param(["algo.advantage.name=gae", "train.updates_per_batch=2"],
                                               id="ppo_with_critic", marks=pytest.mark.slow)])
def test_resume_is_bitwise_exact(algo, tiny_model_path, tmp_path):
    """train 4 steps == train 2, stop, resume, train 2: same weights, same metrics (the
    critic's too, for PPO)."""
    common = [*algo, "train.steps=4", "train.deterministic=true", "train.seed=3", "optim.lr=1e-3",
              f"reward=[{{name: '{TOY}:long_text'}}]", "train.save_every=2", "train.threads=1"]
    straight = tmp_path / "straight"
    run_trainer(tiny_overrides(tiny_model_path, straight, *common))
    split = tmp_path / "split"
    run_trainer(tiny_overrides(tiny_model_path, split, *common, "train.stop_after=2"))
    assert (split / "checkpoints" / "latest").read_text().strip() == "step_000002"
    run_trainer(tiny_overrides(tiny_model_path, split, *common, "train.resume=latest"))

    a = load_file(straight / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k

    assert learning(metrics(straight)) == learning(metrics(split))
    assert len(metrics(split)) == 4


def test_kill_during_checkpoint_write_leaves_previous_loadable(tiny_model_path, tmp_path):
    """SIGKILL while step 2's checkpoint is being written: step 1 stays the loadable latest."""
    run = tmp_path / "crash"
    script = textwrap.dedent(f"""
        import time, torch
        import upslope.checkpoint as ck
        from upslope.config import load_config
        from upslope.train.trainers.rl import Trainer
        real_save = torch.save
        def slow_save(obj, path, *a, **k):
            real_save(obj, path, *a, **k)
            if "step_000002" in str(path):
                print("WRITING", flush=True)
                time.sleep(600)
        torch.save = slow_save
        cfg = load_config(None, {tiny_overrides(tiny_model_path, run, "train.steps=3", "train.save_every=1")!r})
        Trainer(cfg).run()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        deadline = time.time() + 300
        line = ""
        while time.time() < deadline and "WRITING" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "WRITING" in line, "the trainer never reached the step-2 checkpoint write"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpts = run / "checkpoints"
    assert any(p.name.startswith(".tmp-step_000002") for p in ckpts.iterdir()), "no partial write to test against"
    from upslope.checkpoint import find_checkpoint, load_trainer_state

    latest = find_checkpoint(run, "latest")
    assert latest.name == "step_000001"
    assert load_trainer_state(latest)["step"] == 1
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(latest / "model")
    # resuming works and the stale partial write is cleaned up by the next checkpoint
    run_trainer(tiny_overrides(tiny_model_path, run, "train.steps=2", "train.resume=latest"))
    assert not any(p.name.startswith(".tmp-") for p in ckpts.iterdir())
    assert find_checkpoint(run, "latest").name == "step_000002"


@pytest.mark.parametrize("args, expected", [
    (["train", "no/such/recipe.yaml"], "recipe file not found"),
    (["train", "train.stepz=3"], "did you mean 'train.steps'"),
    (["train", "rollout.n=1"], "needs rollout.n >= 2"),
    (["train", "algo.advantage.name=grpoo"], "did you mean 'grpo'"),
    (["train", "algo.advantage.options={scale_by_sdt: false}"], "did you mean 'scale_by_std'"),
    (["train", "rollout.kind=multi_trun"], "rollout.kind: unknown rollout 'multi_trun' (did you mean 'multi_turn'?)"),
    (["dpo", "rollout.kind=single_trun"], "did you mean 'single_turn'"),
])
def test_bad_input_is_one_clear_line(args, expected, capsys, smollm_path):
    # the commands use the default model: converted by the session fixture, not inside the captured command
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("upslope: error:") and expected in err[0], err


def test_bad_data_and_rewards_fail_in_one_line(tiny_model_path, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"query": "1+1?", "answer": 2}\n')  # 'question' would be detected as the prompt
    base = tiny_overrides(tiny_model_path, tmp_path / "r", "train.steps=1")
    assert main(["train", *base, f"data.path={data}"]) == 2
    assert "field 'prompt' missing" in capsys.readouterr().err
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "word " * 600, "answer": 1}) + "\n")
    assert main(["train", *base, f"data.path={long}"]) == 2
    assert "over rollout.max_prompt_tokens" in capsys.readouterr().err
    assert main(["train", *base, f"reward=[{{name: '{TOY}:always_fails'}}]"]) == 2
    err = capsys.readouterr().err
    assert "failed on every sample" in err and "ZeroDivisionError" in err
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize("kl_in", ["loss", "reward"])
def test_kl_reference_and_mismatch_correction(kl_in, tiny_model_path, tmp_path):
    """With beta > 0 a frozen reference is loaded and KL grows once the policy moves; the
    importance correction reports its fractions. With beta = 0 there is no reference."""
    run = tmp_path / kl_in
    trainer = run_trainer(tiny_overrides(tiny_model_path, run, "train.steps=3", "optim.lr=3e-2",
                                         f"reward=[{{name: '{TOY}:long_text'}}]", "algo.kl_coef=0.05",
                                         f"algo.kl_in={kl_in}", "algo.correction={level: token, cap: 2.0}"))
    assert trainer.uses_reference and trainer.updater._reference is not None  # loaded once, at set-up
    rows = metrics(run)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == reference
    assert rows[-1]["kl"] > 1e-4
    assert "tis/capped_frac" in rows[-1] and 0.0 <= rows[-1]["tis/masked_frac"] <= 1.0
    plain = Trainer(load_config(None, tiny_overrides(tiny_model_path, tmp_path / "plain", "train.steps=1")))
    try:
        assert not plain.uses_reference and plain.updater._reference is None  # never loaded
    finally:
        plain.close()
