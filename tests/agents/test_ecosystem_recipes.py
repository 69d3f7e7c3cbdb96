"""The recipes of the agent program and the gym-style environment load and roll out a step on the tiny
model, from the test's own working directory (the recipes name their programs relative to themselves): the
python-tool program through rollout.kind=openai_agent, SkyRL-gym's gsm8k_multi_turn through multi_turn, the
verifiers example environment through its own rollout."""
from __future__ import annotations

from pathlib import Path

import pytest

from upslope.config import load_config
from upslope.data import load_examples
from upslope.engine import SamplingParams
from upslope.rollout.plugin import make_rollout

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe, package", [("openai_agent_python.yaml", "openai"), ("skyrl_gym_arith.yaml", "skyrl_gym"),
                                             ("verifiers_products.yaml", "verifiers")])
def test_recipe_rolls_out(recipe, package, tmp_path, tiny_model_path, tokenizer, hf_engine):
    pytest.importorskip(package)
    cfg = load_config(ROOT / "recipes" / recipe, [f"run_dir={tmp_path}", f"model.name={tiny_model_path}"])
    examples = load_examples(cfg.data, "test")[:1]
    params = SamplingParams(n=2, max_new_tokens=cfg.rollout.max_new_tokens, seed=0, stop_token_ids=[2])
    batch = make_rollout(cfg, tokenizer)(hf_engine, [], examples, params, 2)
    assert batch.size == 2 and int(batch.completion_lens.max()) <= cfg.rollout.max_new_tokens
    names = {"openai_agent_python.yaml": {"correct", "tool"}, "skyrl_gym_arith.yaml": {"reward"},
             "verifiers_products.yaml": {"reward"}}[recipe]
    assert all(set(m["reward_parts"]) == names for m in batch.meta)
