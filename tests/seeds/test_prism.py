"""PRISM's contrastive step pairs against a hand-computed tree (look-ahead values, the likeliest lower-valued
sibling as the hard negative, one pair a tree), the option's check, and the recipe's two steps of `upslope rm`
on the tiny model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import metrics

from upslope.batch import build_batch
from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.train.methods.pair_batch import lookahead_step_pairs, pair_rows
from upslope.train.trainers.rm import RMTrainer

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "fixtures" / "toy_rewards.py"


def a_tree(leaf_b0: float):
    """One prompt, three steps a, b, c (the first completion token), each with two leaves (the other two tokens).
    Rewards 1, 1 | 0, 1 | 0, 0: look-ahead values a 1, b 0.5, c 0. Sampler log-probs: a's step -1, b's -0.5,
    c's -0.1; leaf b0's tokens `leaf_b0`. A second prompt of two flat replies, tied: no pair."""
    trees = [{"nodes": [s, f"{s}{k}"], "ends": [1]} for s in "abc" for k in range(2)]
    logps = [[-1.0] * 3, [-1.0] * 3, [-0.5, leaf_b0, leaf_b0], [-0.5, -3.0, -3.0], [-0.1, -1.0, -1.0],
             [-0.1, -1.0, -1.0]]
    completions = [[20 + i, 30 + i, 40 + i] for i in range(6)] + [[5], [6]]
    b = build_batch([[7]] * 8, completions, logps + [[0.0], [0.0]], [0] * 6 + [1, 1], [False] * 8, pad_id=0,
                    meta=[{"tree": t} for t in trees] + [{}, {}])
    b.rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    return b


def test_step_pairs_by_hand():
    """Top level: a (1) against the likeliest of b (-0.5) and c (-0.1): c. Under b: b1 (1) against b0. With b0's
    tokens at -2 the tree's pair is (a, c), the first step of rows 0 and 4; at -0.05 b0 is the likelier negative
    and the pair is (b1, b0), rows 3 and 2 whole."""
    pairs = lookahead_step_pairs(a_tree(-2.0))
    assert pairs.size == 2 and pairs.group_ids.tolist() == [0, 0]
    assert pairs.seq_lens.tolist() == [2, 2] and pairs.input_ids.tolist() == [[7, 20], [7, 24]]
    assert pairs.rewards.tolist() == [1.0, 0.0] and pairs.loss_mask.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    chosen, rejected = pair_rows(pairs.group_ids, pairs.rewards)
    assert (chosen.tolist(), rejected.tolist()) == ([0], [1])
    leaf = lookahead_step_pairs(a_tree(-0.05))
    assert leaf.input_ids.tolist() == [[7, 23, 33, 43], [7, 22, 32, 42]] and leaf.rewards.tolist() == [1.0, 0.0]
    assert not bool(leaf.truncated.any())


def test_a_batch_of_tied_trees_gives_no_pair():
    b = a_tree(-2.0)
    b.rewards = torch.ones(8)
    assert lookahead_step_pairs(b).size == 0


def test_step_pairs_need_a_tree_rollout(tmp_path):
    cfg = load_config(ROOT / "recipes" / "prism.yaml", [f"run_dir={tmp_path}", "rollout.kind=single_turn"])
    with pytest.raises(ConfigError, match="rm.pairs=lookahead_steps: .* set rollout.kind=tree"):
        RMTrainer(cfg)


def test_the_prism_recipe_runs_two_steps(tiny_model_path, tmp_path):
    cfg = load_config(ROOT / "recipes" / "prism.yaml", [
        f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path / 'r'}", "log.progress=false",
        "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=4", "rollout.max_new_tokens=6",
        "train.threads=1", "train.steps=2", f"reward=[{{name: '{TOY}:long_text'}}]", "rm.eval_pairs=4",
        "rm.pairs_per_step=2", "eval.limit=8", "train.eval_every=0", "optim.lr=1e-3"])
    assert cfg.rm.pairs == "lookahead_steps" and cfg.rollout.kind == "tree"
    trainer = RMTrainer(cfg)
    try:
        results = trainer.run()
    finally:
        trainer.close()
    assert 0.0 <= results["after"]["accuracy"] <= 1.0
    rows = metrics(tmp_path / "r")
    assert max(r.get("pairs/kept", 0.0) for r in rows) > 0, f"no training step built a step pair: {rows}"
