"""DCMDP's dual ascent and MIPU's acceptance test: by hand, then inside `upslope train` on the tiny
model (the multiplier follows the logged discrepancy and is checkpointed; a vetoed update leaves
the weights exactly as they were)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from run_helpers import metrics, trained

from upslope import checkpoint as ckpt
from upslope.algos.kl import k3
from upslope.algos.trust import DiscrepancyConstraint, DualController, improvement_proxy
from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.train.trainers.rl import Trainer

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


def test_dual_ascent_by_hand_and_its_state():
    dual = DualController(init=0.0, lr=2.0, tolerance=0.01)
    seq = [dual.update(x) for x in (0.05, 0.0, 0.0, math.nan, 0.03)]
    assert seq == pytest.approx([0.08, 0.06, 0.04, 0.04, 0.08])  # NaN leaves it; never below 0
    assert [dual.update(0.0) for _ in range(5)] == pytest.approx([0.06, 0.04, 0.02, 0.0, 0.0])
    other = DualController(1.0, 1.0, 0.0)
    other.load_state_dict(DualController(0.25, 1.0, 0.0).state_dict())
    assert other.value == 0.25
    with pytest.raises(ConfigError, match="lr > 0"):
        DualController(0.0, 0.0, 0.0)


def test_improvement_proxy_by_hand():
    lp = torch.log(torch.tensor([[0.6, 0.3, 0.9]], dtype=torch.float64))
    sampler = torch.log(torch.tensor([[0.5, 0.5, 0.1]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    gain = ((0.6 / 0.5 - 1) * 1.0 + (0.3 / 0.5 - 1) * -1.0) / 2  # (0.2 + 0.4) / 2
    gap = float(k3(lp, sampler)[0, :2].mean())
    assert improvement_proxy(lp, sampler, adv, mask, 0.0) == pytest.approx(gain)
    assert improvement_proxy(lp, sampler, adv, mask, 2.0) == pytest.approx(gain - 2 * gap)


def overrides(model: str, run: Path, *extra: str) -> list[str]:
    return [f"model.name={model}", "engine.name=hf", f"run_dir={run}", "log.progress=false", "log.tensorboard=false",
            "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6",
            "train.eval_before=false", "train.eval_after=false", "train.threads=1", "optim.lr=1e-2",
            f"reward=[{{name: '{TOY}:long_text'}}]", *extra]


def run(model: str, run_dir: Path, *extra: str) -> tuple[Trainer, list[dict]]:
    return trained(Trainer(load_config(None, overrides(model, run_dir, *extra)))), metrics(run_dir)


def dcmdp_term(trainer: Trainer) -> DiscrepancyConstraint:
    """The run's DCMDP loss term."""
    (term,) = [t for t in trainer.objective.terms if isinstance(t, DiscrepancyConstraint)]
    return term


def test_dcmdp_multiplier_follows_the_discrepancy_and_is_checkpointed(tiny_model_path, tmp_path):
    trainer, rows = run(tiny_model_path, tmp_path / "dcmdp", "train.steps=2", "train.save_every=2",
                        "algo.terms=[{name: dcmdp, options: {init: 0.5, lr: 10.0, tolerance: 0.0}}]")
    steps = [r for r in rows if "dcmdp/lambda" in r]
    assert len(steps) == 2 and steps[0]["dcmdp/lambda"] == 0.5
    assert all(r["dcmdp/discrepancy"] >= 0 for r in steps)
    want = max(0.0, 0.5 + 10.0 * steps[0]["dcmdp/discrepancy"])
    assert steps[1]["dcmdp/lambda"] == pytest.approx(want)
    final = max(0.0, want + 10.0 * steps[1]["dcmdp/discrepancy"])
    assert dcmdp_term(trainer).dual.value == pytest.approx(final)
    state = ckpt.load_trainer_state(ckpt.find_checkpoint(tmp_path / "dcmdp", "latest"))
    assert state["loss_terms"][str(trainer.objective.terms.index(dcmdp_term(trainer)))]["value"] == pytest.approx(final)
    resumed = Trainer(load_config(None, overrides(tiny_model_path, tmp_path / "dcmdp", "train.steps=3",
                                                  "train.resume=latest",
                                                  "algo.terms=[{name: dcmdp, options: {init: 0.5, lr: 10.0, tolerance: 0.0}}]")))
    try:
        assert dcmdp_term(resumed).dual.value == pytest.approx(final)
    finally:
        resumed.close()


@pytest.mark.parametrize("min_gain, accepted", [(1e9, False), (-1e9, True)], ids=["vetoed", "accepted"])
def test_mipu_veto_restores_the_weights_exactly(min_gain, accepted, tiny_model_path, tmp_path):
    cfg = load_config(None, overrides(tiny_model_path, tmp_path / "mipu", "train.steps=1",
                                      f"algo.accept={{name: mipu, options: {{min_gain: {min_gain}}}}}"))
    trainer = Trainer(cfg)
    try:
        before = {n: p.detach().clone() for n, p in trainer.updater.model.named_parameters()}
        opt_before = trainer.updater.optimizer.state_dict()["state"]
        metrics = trainer.step(1)
        after = dict(trainer.updater.model.named_parameters())
    finally:
        trainer.close()
    assert metrics["mipu/accepted"] == float(accepted) and math.isfinite(metrics["mipu/proxy"])
    assert metrics["mipu/proxy"] == pytest.approx(metrics["mipu/gain"] - metrics["mipu/gap"])  # gap_coef 1
    assert metrics["mipu/gap"] >= 0
    same = all(torch.equal(before[n], after[n].detach()) for n in before)
    assert same is not accepted
    if not accepted:  # the optimiser's moments are rolled back with the weights
        assert len(trainer.updater.optimizer.state_dict()["state"]) == len(opt_before)


def test_dcmdp_adds_lambda_times_the_discrepancy_to_the_rl_loss():
    from upslope.batch import build_batch
    from upslope.train.learner.logprobs import HeadOutput
    from upslope.train.learner.objectives import RLObjective

    mb = build_batch(prompt_ids=[[7], [7]], completion_ids=[[5, 6], [5, 6]],
                     completion_logprobs=[[-0.5, -1.0], [-2.0, -0.1]], group_ids=[0, 0], truncated=[False, False],
                     pad_id=0)
    mb.advantages = mb.loss_mask * torch.tensor([[1.0], [-1.0]])
    lp = torch.tensor([[0.0, -0.7, -1.2], [0.0, -1.5, -0.3]], requires_grad=True)
    norms = {"num_tokens": float(mb.loss_mask.sum()), "num_seqs": 2.0}

    def loss_with(extra: list[str]) -> tuple[torch.Tensor, dict]:
        out = RLObjective.from_config(load_config(None, extra)).loss(HeadOutput(lp, torch.zeros_like(lp)), mb, norms)
        return out.loss, out.metrics

    plain, _ = loss_with([])
    with_dual, metrics = loss_with(["algo.terms=[{name: dcmdp, options: {init: 2.0}}]"])
    disc = (k3(lp, mb.sampler_logprobs) * mb.loss_mask).sum() / mb.loss_mask.sum()
    assert metrics["dcmdp/discrepancy"] == pytest.approx(float(disc.detach()))
    assert float((with_dual - plain).detach()) == pytest.approx(2.0 * float(disc.detach()))
    (g_plain,) = torch.autograd.grad(plain, lp)
    (g_dual,) = torch.autograd.grad(with_dual, lp)
    (g_disc,) = torch.autograd.grad(2.0 * disc, lp)
    assert torch.allclose(g_dual - g_plain, g_disc, atol=1e-6)
