"""Policy losses that read the learner's own per-token internals: PAEC.

A loss registered with `token_stats=True` is given, from the training forward itself (no second
pass), `entropy` [N, L] (with gradient) and, with `top_k=K`, `topk_logprobs` [N, L, K] (the policy's
K most likely tokens, sorted), as keyword arguments after `mask` (positional parameters, so they are
not config options). `upslope.train.learner.objectives.RLObjective` passes them.
"""
import math

import torch
from torch import Tensor

from upslope.algos.common import masked_mean
from upslope.algos.losses import ppo_clip
from upslope.bounds import ClipLow, NonNegative, PositiveFraction
from upslope.errors import ConfigError
from upslope.registry import POLICY_LOSSES

PAEC_TOP_K = 20  # the "local" distribution: the policy's 20 most likely tokens


def decision_mask(topk_logprobs: Tensor, top_p: float) -> Tensor:
    """Soft decision mask [N, L] in [0, 1]: (entropy of the top-p nucleus within the top-K) / log K
    x (1 - (p1 - p2)), the top-two competition. High where the policy hesitates between candidates."""
    p = topk_logprobs.detach().to(torch.float64).exp()
    keep = (p.cumsum(-1) - p) < top_p  # the tokens up to and including the one that crosses top_p
    q = torch.where(keep, p, torch.zeros_like(p))
    q = q / q.sum(-1, keepdim=True).clamp(min=1e-300)
    local = -(q * q.clamp(min=1e-300).log()).sum(-1) / math.log(p.shape[-1])
    competition = 1 - (p[..., 0] - p[..., 1])
    return (local.clamp(0, 1) * competition).to(torch.float32)


@POLICY_LOSSES.register("paec", token_stats=True, top_k=PAEC_TOP_K)
def paec(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, entropy: Tensor | None = None,
         topk_logprobs: Tensor | None = None, *, coef: NonNegative = 0.1, h_min: NonNegative = 0.5,
         top_p: PositiveFraction = 0.95,
         eps_low: ClipLow = 0.2, eps_high: NonNegative = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """PAEC (Yang et al. 2026): PPO's clipped loss + coef x m_t x max(0, h_min - H_t) at soft decision positions m_t.

    coef: weight of the entropy lower-bound penalty (>= 0; 0 is ppo_clip)
    h_min: the anchor: entropy (nats) below which a decision position is penalised (>= 0)
    top_p: nucleus of the local entropy, within the policy's top 20 tokens (0 < top_p <= 1)
    eps_low: PPO clip below, 1 - eps_low
    eps_high: PPO clip above, 1 + eps_high

    m_t is `decision_mask` (detached). Our choices where the abstract is open: the local
    distribution is the top-p nucleus of the top 20 tokens, the mask is the product of its
    normalised entropy and the top-two competition, and the anchor is a fixed entropy floor.
    The penalty acts on zero-advantage rows too, so the loss is not zero at zero advantage.
    """
    if coef < 0 or h_min < 0 or not 0 < top_p <= 1:
        raise ConfigError(f"paec needs coef >= 0, h_min >= 0, 0 < top_p <= 1 (got {coef}, {h_min}, {top_p})")
    if entropy is None or topk_logprobs is None:
        raise ConfigError("policy_loss 'paec' needs the learner's entropy and top-k log-probs (the RL trainer passes them)")
    loss, metrics = ppo_clip(logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    m = decision_mask(topk_logprobs, top_p) * (mask > 0)
    penalty = coef * m * (h_min - entropy).clamp(min=0)
    metrics = {**metrics, "paec/mask_mean": masked_mean(m, mask).detach(),
               "paec/penalty": masked_mean(penalty.detach(), mask)}
    return loss + torch.where(mask > 0, penalty, torch.zeros_like(penalty)), metrics
