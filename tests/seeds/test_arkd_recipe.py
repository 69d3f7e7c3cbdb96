"""recipes/arkd.yaml through `upslope distill` on the tiny model (HF engine), a second tiny model as teacher:
the adaptive forward-KL weight is logged and stays inside [floor, 1 - floor], and its learned weighting moves."""
from __future__ import annotations

import math
from pathlib import Path

from run_helpers import metrics

from upslope.cli import main
from upslope.models import make_tiny_model

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "arkd.yaml"


def test_arkd_recipe_runs_and_logs_its_weight(tiny_model_path, smollm_path, tmp_path):
    teacher = make_tiny_model(smollm_path, tmp_path / "teacher", seed=1)
    run_dir = tmp_path / "run"
    rc = main(["distill", str(RECIPE), f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}",
               "log.progress=false", "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2",
               "rollout.n=2", "rollout.max_new_tokens=6", "train.steps=2", "train.eval_before=false",
               "train.eval_after=false", "train.threads=1", f"distill.teacher={teacher}"])
    assert rc == 0
    rows = metrics(run_dir)
    weights = [r["distill/arkd_fkl_weight"] for r in rows if "distill/arkd_fkl_weight" in r]
    assert len(weights) == 2 and all(0.1 - 1e-6 <= w <= 0.9 + 1e-6 for w in weights)
    # the learned weighting: its parameters logged each step, moved at step 2 by step 1's reward
    learned = [r for r in rows if "distill/arkd_a" in r]
    assert [r["step"] for r in learned] == [1, 2] and "distill/arkd_reward" in learned[1]
    assert learned[0]["distill/arkd_a"] == -2.0 and learned[1]["distill/arkd_a"] != -2.0
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
