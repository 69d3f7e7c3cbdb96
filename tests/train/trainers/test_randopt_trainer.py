"""`upslope randopt` end to end on the tiny model with the HF engine: it raises a learnable reward,
resumes bit for bit, leaves the engine holding the policy's weights after every step, honours its
held-out gate, and rejects what it cannot run in one line (vLLM: tests/rollout/test_perturbed_engines.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_helpers import learning, metrics
from safetensors.torch import load_file

from upslope.cli import main
from upslope.config import load_config
from upslope.train.trainers.randopt import (RandOptTrainer, check_config, direction_coefficients, directions,
                                            per_prompt_means)

TOY = Path(__file__).resolve().parents[2] / "fixtures" / "toy_rewards.py"
RECIPES = Path(__file__).resolve().parents[3] / "recipes"


@pytest.mark.parametrize("name", ["randopt", "corp"])
def test_recipes_are_valid(name, tmp_path):
    cfg = load_config(RECIPES / f"{name}.yaml", [f"run_dir={tmp_path}"])
    check_config(cfg)
    assert cfg.data.options["digits"] == 2 and cfg.rollout.temperature == 0  # the headroom task, greedy scoring


def test_directions_pair_up_and_coefficients_fold_onto_them():
    assert directions(4, antithetic=True) == [(0, 1.0), (0, -1.0), (1, 1.0), (1, -1.0)]
    assert directions(3, antithetic=False) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    # a mirrored pair's coefficients meet on its direction: +0.1 d0 and 0.3 x (-d0) give -0.2 d0
    coefs = direction_coefficients(torch.tensor([0.1, 0.3, -0.2, 0.0]), directions(4, antithetic=True))
    assert coefs == pytest.approx({0: -0.2, 1: -0.2})
    means = per_prompt_means(torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0]), torch.tensor([0, 0, 1, 1, 2]), 3)
    assert means.tolist() == [0.5, 0.5, 2.0]


def overrides(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=6", "train.eval_before=false", "train.eval_after=false", "train.eval_every=0",
            "train.threads=1", "train.deterministic=true", "train.precision=float32", "randopt.population=4",
            "randopt.sigma=0.05", "data.options.count=64", "eval.limit=4",
            f"reward=[{{name: '{TOY}:long_text'}}]", *extra]


def rows(run_dir: Path) -> list[dict]:
    return learning(metrics(run_dir))


def run(args: list[str], check_engine: bool = True) -> RandOptTrainer:
    trainer = RandOptTrainer(load_config(None, args))
    try:
        trainer.run()
        if check_engine:  # the engine holds exactly the policy's weights (fp32 HF engine: bitwise)
            engine = dict(trainer.runtime.engine.model.named_parameters())
            for name, p in trainer.updater.model.named_parameters():
                assert torch.equal(engine[name], p), name
    finally:
        trainer.close()
    return trainer


def test_resume_is_bitwise_exact_and_the_engine_follows_the_policy(tiny_model_path, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["train.steps=2", "randopt.population=2", "randopt.consolidate.options={lr: 0.5}"]
    run(overrides(tiny_model_path, straight, *common))
    run(overrides(tiny_model_path, split, *common, "train.stop_after=1"))
    assert run(overrides(tiny_model_path, split, *common, "train.resume=latest")).start_step == 1
    a = load_file(straight / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    base = load_file(f"{tiny_model_path}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], base[k]) for k in base)  # the policy moved
    assert rows(straight) == rows(split) and len(rows(split)) == 2
    assert any(r["randopt/update_rms"] > 0 for r in rows(straight)) and rows(straight)[0]["randopt/reward_spread"] > 0


def test_gate_keeps_an_update_only_when_the_held_out_reward_holds(tiny_model_path, tmp_path):
    common = ["train.steps=2", "randopt.population=2", "randopt.gate_prompts=2", "randopt.gate_tolerance=0.01",
              "randopt.consolidate={name: corp, options: {elite: 0.5}}"]
    run(overrides(tiny_model_path, tmp_path / "gate", *common))
    for r in rows(tmp_path / "gate"):
        accepted = r["randopt/gate_candidate"] >= r["randopt/gate_base"] - 0.01
        assert r["randopt/accepted"] == float(accepted)
        assert (r["randopt/update_rms"] == 0) == (not accepted or r["corp/kept"] == 0), r


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["{name: es, options: {lr: 0.2}}", "{name: corp, options: {elite: 0.25}}"])
def test_the_policy_learns_a_learnable_reward(rule, tiny_model_path, tmp_path):
    """Four fixed prompts, greedy: the gate (always accepting here) scores the policy itself on them
    before and after each step. Seen: the tiny model's greedy replies start near 0.06 and reach 0.37-0.6
    within 10 steps, while its perturbed copies average 0.5 at step 1."""
    run(overrides(tiny_model_path, tmp_path / "learn", "train.steps=6", "randopt.population=8", "rollout.n=1",
                  "rollout.temperature=0", "rollout.prompts_per_step=4", "data.options.count=4",
                  "randopt.gate_prompts=4", "randopt.gate_tolerance=10", f"randopt.consolidate={rule}"),
        check_engine=False)
    steps = rows(tmp_path / "learn")
    before, after = steps[0]["randopt/gate_base"], steps[-1]["randopt/gate_candidate"]
    assert after > before + 0.1, [(r["randopt/gate_base"], r["randopt/gate_candidate"]) for r in steps]
    # the policy scored at step t + 1 is the one step t consolidated: the engine followed it exactly
    assert all(a["randopt/gate_candidate"] == b["randopt/gate_base"] for a, b in zip(steps, steps[1:]))


@pytest.mark.parametrize("args, expected", [
    (["randopt.population=5"], "antithetic pairs need an even population"),
    (["lora.enabled=true"], "LoRA is not supported"),
    (["randopt.consolidate.name=cor"], "did you mean 'corp'"),
    (["randopt.consolidate={name: es, options: {lrr: 1}}"], "did you mean 'lr'"),
    (["randopt.sigma=0"], "randopt.sigma"),
])
def test_bad_options_are_one_clear_line(args, expected, tmp_path, capsys):
    assert main(["randopt", *args, f"run_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("upslope: error:") and expected in err[0], err


VLLM_SCRIPT = """
import json, sys
from upslope.batch import build_batch
from upslope.config import load_config
from upslope.engine import SamplingParams
from upslope.train.trainers.randopt import RandOptTrainer

trainer = RandOptTrainer(load_config(None, json.loads(sys.argv[1])))
engine = trainer.runtime.engine
trainer.run()
probe = trainer.prompt_ids[:4]
greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8, stop_token_ids=trainer.runtime.stop_ids)
out = [g[0] for g in engine.generate(probe, greedy)]
b = build_batch(probe, [c.token_ids for c in out], [c.logprobs for c in out], range(4), [False] * 4,
                trainer.runtime.tokenizer.pad_token_id)
lp = trainer.updater.logprobs(b, temperature=1.0)
gap = float(((lp - b.sampler_logprobs).abs() * b.loss_mask).sum() / b.loss_mask.sum())
print(json.dumps({"version": engine.version, "sync_gap": gap}))
trainer.close()
"""


@pytest.mark.slow
def test_two_steps_through_vllm_leave_it_holding_the_policy(tiny_model_path, tmp_path):
    """In a process of its own (one vLLM engine per process): 2 steps of 4 perturbations push 2 x (4 + 1)
    weight sets, and afterwards vLLM's greedy log-probs match the learner's fp32 ones to bf16 noise."""
    pytest.importorskip("vllm")
    import subprocess
    import sys

    args = [a for a in overrides(tiny_model_path, tmp_path / "vllm", "train.steps=2") if a != "engine.name=hf"]
    proc = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, json.dumps([*args, "engine.name=vllm"])],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["version"] == 10 and result["sync_gap"] < 0.05, result
