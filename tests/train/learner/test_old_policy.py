"""algo.old_policy: the policy loss's ratio against the learner's own weights before the update (ratio 1
with one update per batch) or against the sampler's log-probs (the policy that generated the samples, so
the clip bounds the update of stale samples). Checked on a hand-computed case."""
from __future__ import annotations

import math

import pytest
import torch

from upslope.batch import Batch
from upslope.config import load_config
from upslope.train.learner.logprobs import HeadOutput
from upslope.train.learner.objectives import RLObjective


def objective(old_policy: str) -> RLObjective:
    cfg = load_config(None, [f"algo.old_policy={old_policy}", "algo.policy_loss.options={eps_low: 0.2, eps_high: 0.2}",
                             "algo.loss_agg=token_mean"])
    return RLObjective.from_config(cfg)


def one_row(sampler_probs: list[float]) -> Batch:
    """One completion of 3 trained tokens, advantage +1 on each."""
    return Batch(input_ids=torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3, dtype=torch.bool),
                 loss_mask=torch.ones(1, 3), prompt_lens=torch.zeros(1, dtype=torch.long),
                 seq_lens=torch.full((1,), 3), group_ids=torch.zeros(1, dtype=torch.long),
                 sampler_logprobs=torch.tensor([[math.log(p) for p in sampler_probs]]),
                 truncated=torch.zeros(1, dtype=torch.bool), policy_version=torch.zeros(1, dtype=torch.long),
                 advantages=torch.ones(1, 3))


@pytest.mark.parametrize("old_policy, loss, grads", [
    # ratios 0.5/0.5 = 1, 0.5/0.25 = 2 (above 1 + 0.2 with a positive advantage: clipped, no gradient),
    # 0.5/1.0 = 0.5 (below the band, but pushing it up is allowed): -(1 + 1.2 + 0.5) / 3 = -0.9
    ("sampler", -0.9, [-1 / 3, 0.0, -0.5 / 3]),
    # against the learner's own log-probs every ratio is 1: -(1 + 1 + 1) / 3, each token's gradient -1/3
    ("learner", -1.0, [-1 / 3, -1 / 3, -1 / 3]),
])
def test_the_ratio_is_taken_against_the_chosen_policy(old_policy, loss, grads):
    obj = objective(old_policy)
    mb = one_row([0.5, 0.25, 1.0])
    lp = torch.full((1, 3), math.log(0.5), requires_grad=True)
    out = obj.loss(HeadOutput(lp, torch.zeros(1, 3)), mb, {"num_tokens": 3.0, "num_seqs": 1.0}).loss
    out.backward()
    assert out.detach().item() == pytest.approx(loss, abs=1e-6)
    assert lp.grad[0].tolist() == pytest.approx(grads, abs=1e-6)


def test_old_policy_is_validated():
    from upslope.errors import ConfigError

    with pytest.raises(ConfigError, match="old_policy"):
        load_config(None, ["algo.old_policy=behaviour"])
