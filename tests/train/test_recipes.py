"""Every RL recipe in recipes/ runs 2 training steps on a tiny model (HF engine). Recipes of the
other commands (they configure an `sft`, `rft`, `dpo` or `distill` section) are run by their
own trainers' tests in tests/offline."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from upslope.config import load_config
from upslope.train.trainers.rl import Trainer

OTHER_COMMANDS = ("sft", "rft", "dpo", "distill")


def is_rl_recipe(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text()) or {}
    if any(k in raw for k in OTHER_COMMANDS):
        return False
    return is_rl_recipe(path.parent / raw["base"]) if raw.get("base") else True


RECIPES = [r for r in sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml")) if is_rl_recipe(r)]


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_runs_two_steps(recipe, tiny_model_path, tmp_path):
    cfg = load_config(recipe, [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path}",
                               "log.progress=false", "log.tensorboard=false", "log.plot=false",
                               "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=6",
                               "train.steps=2", "train.eval_before=false", "train.eval_after=false",
                               "train.eval_every=0", "rollout.max_resample_rounds=1"])
    trainer = Trainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        if r.get("skipped"):  # dynamic sampling may filter out every group of a random model
            assert "filter/groups_dropped" in r
            continue
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])
    saved = tmp_path / "checkpoints" / "step_000002" / "model"
    assert (saved / ("adapter_config.json" if cfg.lora.enabled else "config.json")).exists()
    if recipe.stem == "gdpo":  # each component's group-normalised advantage is logged
        assert {"adv_component/correct/mean_abs", "adv_component/number_first/mean_abs"} <= rows[-1].keys()
