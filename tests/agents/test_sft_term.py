"""The interleaved SFT term is an advantage bonus: at importance ratio 1 (the first update on a batch)
adding w to the advantages of some tokens changes the policy-loss gradient by exactly the gradient
of w x those tokens' negative log-likelihood, under the same loss aggregation."""
from __future__ import annotations

import pytest
import torch

from upslope.algos.aggregate import aggregate, loss_normalizers
from upslope.registry import POLICY_LOSSES


@pytest.mark.parametrize("loss_name", ["ppo_clip", "cispo"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_advantage_bonus_equals_a_weighted_nll_gradient(loss_name, agg):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 12, generator=gen) > 0.3).float()
    sft = mask * (torch.rand(4, 12, generator=gen) > 0.5).float()  # the valid tool-call turns' tokens
    adv = torch.randn(4, 12, generator=gen) * mask
    lp0 = -torch.rand(4, 12, generator=gen) * 3
    loss_fn = POLICY_LOSSES.bind(loss_name)
    norms = loss_normalizers(mask)
    w = 0.5

    def grad(advantages: torch.Tensor, extra: float = 0.0) -> torch.Tensor:
        lp = lp0.clone().requires_grad_(True)
        per_token, _ = loss_fn(lp, lp0, advantages, mask)
        total = aggregate(per_token, mask, agg, **norms)
        if extra:
            total = total + extra * aggregate(-lp * sft, mask, agg, **norms)
        total.backward()
        return lp.grad

    with_bonus = grad((adv + w * sft) * mask)
    with_nll = grad(adv, extra=w)
    torch.testing.assert_close(with_bonus, with_nll, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(with_bonus, grad(adv))
