"""SuCo's first stage (recipes/suco_mft.yaml through `upslope rft`): the recipe's rewards and rft.threshold keep
exactly the right replies within their group's sufficient length, by hand; the stage runs on the tiny model."""
from __future__ import annotations

from pathlib import Path

from run_helpers import metrics

from upslope.algos.rejection import keep_indices
from upslope.cli import main
from upslope.config import load_config
from upslope.rewards import build_reward_fns, score

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "suco_mft.yaml"


def test_the_recipe_keeps_right_replies_within_the_sufficient_length():
    """Prompt a (answer 6): right replies of 10 and 20 tokens, wrong ones of 5 and 30: accuracy 1/2, sufficient
    length 10 x (1 + 1 x 1/2) = 15, so the 20-token right reply scores 1 - 0.5 x 5/20 and only the 10-token one
    reaches 1.0. Prompt b: right replies of 12 and 14 tokens, accuracy 1, sufficient length 12: only the 12."""
    cfg = load_config(str(RECIPE), [])
    fns = build_reward_fns(cfg.reward, cfg.data)
    texts = ["6", "6", "5", "5", "7", "7"]
    lengths = [10, 20, 5, 30, 12, 14]
    metas = [{"example_id": "a" if i < 4 else "b", "completion_tokens": n} for i, n in enumerate(lengths)]
    result = score(fns, texts, [6, 6, 6, 6, 7, 7], metas)
    combined = [sum(result.weights[k] * result.components[k][i] for k in result.components) for i in range(6)]
    assert combined[:2] == [1.0, 1.0 - 0.5 * 5 / 20] and combined[4:] == [1.0, 1.0 - 0.5 * 2 / 14]
    assert combined[2] == 0.5 * -(15 - 5) / 15 and combined[3] == 0.0  # wrong: under-thinking, or not under
    kept = keep_indices(combined, [0, 0, 0, 0, 1, 1], [(t, n) for t, n in zip(texts, lengths)],
                        threshold=cfg.rft.threshold, dedupe=cfg.rft.dedupe, max_per_prompt=cfg.rft.max_per_prompt)
    assert sorted(kept) == [0, 4]


def test_the_stage_runs_through_upslope_rft(tiny_model_path, tmp_path):
    run = tmp_path / "mft"
    rc = main(["rft", str(RECIPE), f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}",
               "log.progress=false", "log.tensorboard=false", "log.plot=false", "rft.prompts_per_round=2",
               "rollout.n=2", "rollout.max_new_tokens=4", "train.steps=1", "train.eval_every=0",
               "train.eval_before=false", "train.eval_after=false", "train.threads=1"])
    assert rc == 0
    [row] = [r for r in metrics(run) if "rft/kept" in r]
    assert row["step"] == 1 and 0 <= row["rft/kept"] <= 4 and "reward/length" in row
