"""The agent recipes load, offer their tools in a prompt that fits rollout.max_prompt_tokens, and
run a multi-turn rollout step (tiny model in place of the embedded one)."""
from __future__ import annotations

from pathlib import Path

import pytest

from upslope.rollout.multi_turn import AgentRun, multi_turn
from upslope.config import load_config
from upslope.data import load_examples
from upslope.engine import SamplingParams

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("agent_*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_agent_recipe_prompts_fit_and_roll_out(recipe, tokenizer, hf_engine, tmp_path):
    cfg = load_config(recipe, [f"run_dir={tmp_path}"])
    assert cfg.rollout.kind == "multi_turn" and cfg.reward[0].name == "env"
    run = AgentRun.from_config(cfg, tokenizer)
    examples = load_examples(cfg.data, "test")[:1]
    tr = run.start(examples[0], 0)
    assert len(tr.prompt) <= cfg.rollout.max_prompt_tokens
    tools = [t.name for t in cfg.agent.tools]
    assert all(name in tr.history[0]["content"] or cfg.agent.tool_format == "python_block" for name in tools)
    batch = multi_turn(hf_engine, [], examples, SamplingParams(n=2, max_new_tokens=cfg.rollout.max_new_tokens, seed=0,
                                                               stop_token_ids=[2]), 2, run=run)
    assert batch.size == 2 and int(batch.completion_lens.max()) <= cfg.rollout.max_new_tokens
    assert all(set(m["reward_parts"]) == set(tr.env.reward_names) for m in batch.meta)
