"""CSRM: the calibration term beside the Bradley-Terry loss and the held-out calibration of sigmoid(score)
by hand, a reward model conditioned on each example's written specification, and the recipe's two
steps of `upslope rm` on the tiny model."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from upslope.algos.preference import score_calibration_loss
from upslope.batch import build_batch
from upslope.config import RewardSpec, load_config
from upslope.errors import UpslopeError
from upslope.rewards import build_reward_fns
from upslope.rewards.context import RewardContext
from upslope.train.learner.objectives import BradleyTerryObjective
from upslope.train.trainers.rm import RMTrainer, score_calibration

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "fixtures" / "toy_rewards.py"


def test_calibration_loss_by_hand():
    got = score_calibration_loss(torch.tensor([0.0, 0.0, math.log(3.0)]), torch.tensor([1.0, 0.0, 1.0]))
    assert got.tolist() == pytest.approx([math.log(2), math.log(2), -math.log(0.75)])
    assert score_calibration_loss(torch.tensor([1.0]), torch.tensor([2.0])).tolist() == \
        pytest.approx([math.log(1 + math.exp(-1))])  # a reward above 1 is label 1


def test_bradley_terry_with_calibration_by_hand():
    """One pair, chosen scored 2 and rejected 0: ranking log(1 + e^-2); calibration (BCE(2, 1) + BCE(0, 0)) / 2."""
    mb = build_batch([[1], [1]], [[2], [3]], [[0.0], [0.0]], [0, 0], [False, False], pad_id=0)
    mb.rewards = torch.tensor([1.0, 0.0])
    scores = torch.tensor([2.0, 0.0])
    rank = math.log(1 + math.exp(-2))
    plain = BradleyTerryObjective().loss(scores, mb, {"num_seqs": 2}).loss
    both = BradleyTerryObjective(calibration_coef=1.0).loss(scores, mb, {"num_seqs": 2}).loss
    assert float(plain) == pytest.approx(rank)
    assert float(both) == pytest.approx(rank + (rank + math.log(2)) / 2)


def test_score_calibration_by_hand():
    """sigmoid of 0, 0, ln 3, -ln 3 = 0.5, 0.5, 0.75, 0.25 for labels 1, 0, 1, 0: the 0.5 bin is exact,
    the other two are 0.25 off; ECE 2 x 0.25 / 4, Brier (0.25 + 0.25 + 0.0625 + 0.0625) / 4."""
    got = score_calibration(torch.tensor([0.0, 0.0, math.log(3), -math.log(3)]), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert got == pytest.approx({"ece": 0.125, "brier": 0.15625})


def test_reward_model_reads_each_examples_specification(tiny_reward_model, tokenizer):
    """spec_field gives each sample its own system prompt: the same as system_prompt for one spec, and a
    different score under another spec."""
    def scores(**options):
        [fn] = build_reward_fns([RewardSpec(name="reward_model", options={"path": tiny_reward_model, **options})],
                                context=RewardContext(policy_tokenizer=tokenizer))
        metas = [{"prompt": "What is 2 + 2?", "spec": "Replies must be polite."},
                 {"prompt": "What is 2 + 2?", "spec": "Replies must be one number."}]
        return fn.fn(["4", "4"], [None, None], metas)

    per_example = scores(spec_field="spec")
    assert per_example[0] == pytest.approx(scores(system_prompt="Replies must be polite.")[0], rel=1e-5)
    assert per_example[1] == pytest.approx(scores(system_prompt="Replies must be one number.")[1], rel=1e-5)
    assert per_example[0] != pytest.approx(per_example[1], rel=1e-3)
    [fn] = build_reward_fns([RewardSpec(name="reward_model",
                                        options={"path": tiny_reward_model, "spec_field": "spec"})])
    with pytest.raises(UpslopeError, match="spec_field=spec: sample 0 has no text"):
        fn.fn(["4"], [None], [{"prompt": "What is 2 + 2?"}])


def test_the_csrm_recipe_runs_two_steps_and_reports_calibration(tiny_model_path, tmp_path):
    run_dir = tmp_path / "r"
    cfg = load_config(ROOT / "recipes" / "csrm.yaml", [
        f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
        "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=6", "train.threads=1", "train.steps=2", f"reward=[{{name: '{TOY}:long_text'}}]",
        "rm.eval_pairs=4", "rm.pairs_per_step=4", "eval.limit=8", "train.eval_every=0", "optim.lr=1e-3"])
    assert cfg.rm.calibration_coef == 1.0 and cfg.data.system_prompt.startswith("Specification:")
    trainer = RMTrainer(cfg)
    try:
        results = trainer.run()
    finally:
        trainer.close()
    for when in ("before", "after"):
        assert 0.0 <= results[when]["ece"] <= 1.0 and 0.0 <= results[when]["brier"] <= 1.0
    assert results["before"]["brier"] == pytest.approx(0.25)  # a zero head: every sigmoid(score) is 0.5
