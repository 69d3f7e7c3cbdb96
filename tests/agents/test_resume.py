"""A multi-turn GRPO run on the tiny model resumes exactly: 2 steps straight == 1 step, stop,
resume, 1 step (same weights, same metrics, agent metrics included)."""
from __future__ import annotations

from pathlib import Path

import torch
from agent_helpers import ECHO
from run_helpers import learning, metrics, trained
from safetensors.torch import load_file

from upslope.config import load_config
from upslope.train.trainers.rl import Trainer


def overrides(model: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={model}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "rollout.kind=multi_turn", "rollout.prompts_per_step=2", "rollout.n=3",
            "rollout.max_new_tokens=64", f"agent.env.name={ECHO}", "agent.max_turns=3", "agent.max_turn_tokens=4",
            "agent.tools=[{name: calculator}]", "reward=[{name: env}]", "train.eval_before=false",
            "train.eval_after=false", "train.micro_batch_tokens=1024", "train.steps=2", "train.deterministic=true",
            "train.seed=5", "optim.lr=1e-3", "train.save_every=1", "train.threads=1", *extra]


def run(args: list[str]) -> None:
    trained(Trainer(load_config(None, args)))


def test_resume_in_the_middle_of_a_multi_turn_run(tiny_model_path, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(overrides(tiny_model_path, straight))
    run(overrides(tiny_model_path, split, "train.stop_after=1"))
    assert (split / "checkpoints" / "latest").read_text().strip() == "step_000001"
    run(overrides(tiny_model_path, split, "train.resume=latest"))
    a = load_file(straight / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = learning(metrics(straight))
    assert rows == learning(metrics(split)) and len(rows) == 2
    assert all(r["agent/turns"] > 1 and r["agent/env_tokens"] > 0 for r in rows)
    assert any(r["reward/std"] > 0 for r in rows)  # the trajectories carried a learning signal
