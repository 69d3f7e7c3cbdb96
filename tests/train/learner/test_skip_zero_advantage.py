"""Rows whose advantage is 0 everywhere are not forwarded (train.skip_zero_advantage), and the
update is the same as with every row: same gradients, same parameters after the step."""
from __future__ import annotations

import pytest
import torch

from batch_helpers import grouped_rl_batch

from upslope.batch import Batch
from upslope.config import load_config
from upslope.train.learner.objectives import RLObjective, zero_advantage_rows
from upslope.train.learner.updater import Updater

Learner = tuple[Updater, RLObjective]


def rl_learner(cfg, path: str) -> Learner:
    updater = Updater.from_config(cfg, path, "cpu")
    return updater, RLObjective.from_config(cfg)


def make_batch(advantages_per_group: list[float], n: int = 3, seed: int = 0) -> Batch:
    """See batch_helpers.grouped_rl_batch."""
    return grouped_rl_batch(advantages_per_group, n, seed)


def learner_pair(tiny_model_path: str, *extra: str) -> tuple[Learner, Learner]:
    """Two learners with the same weights, skipping on and off. AdamW's eps is large enough that
    a gradient of rounding-noise size (1e-9, where the two forwards may differ in the last bits)
    cannot be blown up to a full lr-sized step. Both pad their micro-batches, so that they differ only in
    the rows they skip (packing's own equality: test_packing.py)."""
    out = []
    for skip in (True, False):
        cfg = load_config(None, [f"model.name={tiny_model_path}", "train.precision=float32", "optim.lr=1e-2",
                                 "optim.eps=1e-4", "train.micro_batch_tokens=40", "train.packing=false",
                                 f"train.skip_zero_advantage={skip}", *extra])
        torch.manual_seed(0)
        out.append(rl_learner(cfg, tiny_model_path))
    return out[0], out[1]


def captured_grads(learner: Learner) -> list[list[torch.Tensor]]:
    """The gradients each optimiser step sees (after clipping)."""
    seen: list[list[torch.Tensor]] = []
    learner[0].optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append([p.grad.clone() for g in opt.param_groups for p in g["params"]]))
    return seen


def test_zero_advantage_rows_marks_rows_with_no_signal():
    b = make_batch([0.5, 0.0, -1.0], n=3)
    # group 0: +a, -a, 0; group 1: all 0; group 2: +a, -a, 0 (the third row of each group has 0)
    assert zero_advantage_rows(b).tolist() == [False, False, True, True, True, True, False, False, True]


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("share", [True, False], ids=["shared_prompt", "plain"])
def test_skipping_gives_the_same_update(tiny_model_path, loss, share):
    """Two optimiser steps (mini-batches of whole groups), with and without skipping: the
    gradients and the weights after each step agree; fewer rows and tokens are forwarded."""
    skip, full = learner_pair(tiny_model_path, f"algo.policy_loss.name={loss}", "train.updates_per_batch=2",
                              f"train.share_prompt={share}")
    assert skip[1].skips_rows and not full[1].skips_rows
    grads_skip, grads_full = captured_grads(skip), captured_grads(full)
    b = make_batch([0.7, 0.0, -1.3, 0.0, 0.4], n=3)
    b.old_logprobs = skip[0].logprobs(b, temperature=1.0)  # the same "old" policy for both (two updates per batch)
    m_skip = skip[0].update(b, 1, skip[1])
    m_full = full[0].update(b, 1, full[1])
    assert m_skip["learner/rows_skipped_frac"] == pytest.approx(9 / 15)  # two silent groups + one 0 row in each other group
    assert m_skip["learner/tokens"] < m_full["learner/tokens"]
    assert len(grads_skip) == len(grads_full) == 2
    for gs, gf in zip(grads_skip, grads_full):
        for a, c in zip(gs, gf):
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-7)
    for (name, a), c in zip(skip[0].model.named_parameters(), full[0].model.parameters()):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-6, msg=name)
    assert m_skip["loss"] == pytest.approx(m_full["loss"], abs=1e-6)


def test_a_batch_with_no_signal_still_steps_on_zero_gradients(tiny_model_path):
    """Nothing forwarded, but the optimiser steps on zero gradients as it would have: AdamW's
    momentum from the step before still moves the weights, identically."""
    skip, full = learner_pair(tiny_model_path)
    for updater, objective in (skip, full):
        updater.update(make_batch([1.0, -0.5]), 1, objective)
    before = [p.detach().clone() for p in skip[0].model.parameters()]
    m_skip = skip[0].update(make_batch([0.0, 0.0]), 2, skip[1])
    full[0].update(make_batch([0.0, 0.0]), 2, full[1])
    assert m_skip["learner/tokens"] == 0 and m_skip["learner/rows_skipped_frac"] == 1.0
    assert "entropy" not in m_skip  # no token was scored
    moved = [not torch.equal(a, p) for a, p in zip(before, skip[0].model.parameters())]
    assert any(moved)  # momentum carried on
    for a, c in zip(skip[0].model.parameters(), full[0].model.parameters()):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("extra", [["algo.entropy_coef=0.01"], ["algo.kl_coef=0.1", "algo.kl_in=loss"],
                                   ["train.skip_zero_advantage=false"]], ids=["entropy", "kl_in_loss", "off"])
def test_no_skipping_when_zero_advantage_rows_still_have_a_gradient(tiny_model_path, extra):
    cfg = load_config(None, [f"model.name={tiny_model_path}", *extra])
    assert not rl_learner(cfg, tiny_model_path)[1].skips_rows
