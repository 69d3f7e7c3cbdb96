"""No environment token gets gradient or KL, on real multi-turn trajectories (tiny model, real
tokenizer) through the real RL objective: policy loss, TIS correction, KL in the loss, entropy bonus,
KL in the reward, advantages and the token-count normalisers all ignore loss_mask-0 tokens."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from upslope.algos.aggregate import loss_normalizers
from upslope.algos.advantages import grpo
from upslope.algos.kl import kl_penalty_in_reward
from upslope.config import load_config
from upslope.train import stages
from upslope.registry import KL_ESTIMATORS
from upslope.train.learner.logprobs import HeadOutput
from upslope.train.learner.objectives import RLObjective
from upslope.train.learner.updater import Updater
from upslope.train.trainers.rl import with_reference


@pytest.fixture(scope="module")
def learner(tiny_model_path, tmp_path_factory):
    """The tiny policy with every loss term on: KL (k3) in the loss, an entropy bonus, TIS correction."""
    cfg = load_config(None, [f"model.name={tiny_model_path}", "engine.name=hf", "train.precision=float32",
                             "model.dtype=float32", f"run_dir={tmp_path_factory.mktemp('mask')}",
                             "algo.kl_coef=0.1", "algo.kl_in=loss", "algo.entropy_coef=0.01",
                             "algo.correction={level: token, cap: 2.0}", "train.updates_per_batch=1"])
    updater = Updater.from_config(cfg, tiny_model_path, "cpu")
    return updater, RLObjective.from_config(cfg)


@pytest.fixture(scope="module")
def scored(agent_batch, learner):
    """The trajectories with rewards (alternating within groups), GRPO advantages and reference log-probs."""
    batch, _ = agent_batch
    updater, objective = learner
    batch = replace(batch, rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0]))
    batch = stages.advantage(batch, grpo)
    batch, _ = with_reference(batch, updater, objective.temperature, kl_reward=None)
    return batch


def env_positions(batch) -> torch.Tensor:
    """Environment tokens: after the prompt, before the end, loss_mask 0."""
    pos = torch.arange(batch.input_ids.shape[1])[None, :]
    after_prompt = (pos >= batch.prompt_lens[:, None]) & (pos < batch.seq_lens[:, None])
    env = after_prompt & (batch.loss_mask == 0)
    assert env.sum() > 30  # every row has environment turns
    return env


def loss_and_grads(objective, batch, lp, ent):
    lp = lp.detach().clone().requires_grad_(True)
    ent = ent.detach().clone().requires_grad_(True)
    out = objective.loss(HeadOutput(lp, ent), batch, loss_normalizers(batch.loss_mask))
    loss, metrics = out.loss, out.metrics
    loss.backward()
    return loss.detach(), metrics, lp.grad, ent.grad


def test_no_gradient_reaches_an_environment_token(scored, learner):
    """d loss / d log-prob and d loss / d entropy are exactly 0 at every environment token, nonzero on
    model tokens; the policy's forward does not even score environment tokens."""
    updater, objective = learner
    out = updater.forward(updater.model, scored, temperature=1.0, entropy_grad=True)
    env = env_positions(scored)
    assert (out.logprobs[env] == 0).all()
    _, _, g_lp, g_ent = loss_and_grads(objective, scored, out.logprobs, out.entropy)
    assert (g_lp[env] == 0).all() and (g_ent[env] == 0).all()
    model = scored.loss_mask > 0
    assert (g_lp[model] != 0).sum() > model.sum() // 2


def test_loss_kl_and_metrics_ignore_environment_log_probs(scored, learner):
    """Perturbing every log-prob at environment tokens (policy, old, reference, sampler, entropy)
    changes neither the loss nor its KL, mismatch and TIS metrics."""
    updater, objective = learner
    out = updater.forward(updater.model, scored, temperature=1.0, entropy_grad=True)
    env = env_positions(scored).float()
    noise = torch.randn(scored.input_ids.shape, generator=torch.Generator().manual_seed(0)) * 3 * env
    scored = replace(scored, ref_logprobs=scored.ref_logprobs - 0.1 * scored.loss_mask)  # a reference that differs
    loss, metrics, _, _ = loss_and_grads(objective, scored, out.logprobs, out.entropy)
    moved = replace(scored, ref_logprobs=scored.ref_logprobs + noise, sampler_logprobs=scored.sampler_logprobs - noise,
                    advantages=scored.advantages)
    loss2, metrics2, _, _ = loss_and_grads(objective, moved, out.logprobs + noise, out.entropy + noise)
    assert metrics["kl"] > 0
    assert torch.equal(loss, loss2)
    assert metrics == metrics2


def test_kl_in_the_reward_and_advantages_skip_environment_tokens(scored, learner):
    """KL folded into the reward, and the advantages, are 0 on environment tokens whatever the
    log-probs there; the loss normaliser counts model tokens only."""
    _, objective = learner
    env = env_positions(scored)
    noisy = env.float() * 5.0
    base = replace(scored, old_logprobs=scored.sampler_logprobs)
    a, kl_a = kl_penalty_in_reward(base, KL_ESTIMATORS.bind("k3"), 0.1)
    b, kl_b = kl_penalty_in_reward(replace(base, old_logprobs=base.old_logprobs + noisy,
                                                  ref_logprobs=base.ref_logprobs - noisy), KL_ESTIMATORS.bind("k3"), 0.1)
    assert torch.equal(a.rewards, b.rewards) and torch.equal(a.token_rewards, b.token_rewards) and kl_a == kl_b
    assert (a.token_rewards[env] == 0).all()
    assert (scored.advantages[env] == 0).all() and (scored.advantages[scored.loss_mask > 0] != 0).any()
    model_tokens = sum(m["metrics"]["agent/model_tokens"] for m in scored.meta)
    assert loss_normalizers(scored.loss_mask)["num_tokens"] == model_tokens
