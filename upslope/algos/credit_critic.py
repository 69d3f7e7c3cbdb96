"""SR-PPO: token credit from a critic of prefix success, with one rollout per prompt.

The critic (the PPO value model, `critic` section) regresses each prefix on its single rollout's
outcome, a Monte Carlo estimate of the prefix's pass@1 p; the advantage is read in pass@k space,
g(p) = 1 - (1 - p)^k, which shrinks credit on prefixes that are already easy and stretches it
where success is marginal (g's slope k(1 - p)^(k-1) is largest at small p).
"""
import torch
from torch import Tensor

from upslope.algos.advantages import gae_advantages_and_returns
from upslope.algos.common import broadcast_to_tokens, last_token_rewards, masked_whiten
from upslope.batch import Batch
from upslope.bounds import Fraction, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def pass_at_k(p: Tensor, k: int) -> Tensor:
    """1 - (1 - p)^k with p clamped to [0, 1]: the chance that k independent tries include a success."""
    return 1 - (1 - p.clamp(0, 1)) ** k


@ADVANTAGES.register("sr_ppo", critic=True, whole_batch=True)
def sr_ppo(batch: Batch, *, k: PositiveCount = 8, lam: Fraction = 0.95, whiten: bool = False) -> tuple[Tensor, Tensor]:
    """SR-PPO (Che et al. 2026): GAE over pass@k(critic value) of each prefix; the critic learns pass@1 from one rollout.

    k: the pass@k the critic's values are read as (>= 1; 1 is GAE on success probabilities)
    lam: GAE lambda over the transformed values (0: one-step differences g(V_next) - g(V); 1: g(r) - g(V))
    whiten: whiten the advantages over the batch's trained tokens

    Our choices where the abstract is open: the critic's target (returns) is the outcome reward
    (0/1) on every trained token, so it estimates pass@1, and pass@k is derived from it in closed
    form rather than learned; the terminal value is the outcome itself (g(0) = 0, g(1) = 1).
    """
    if k < 1 or not 0 <= lam <= 1:
        raise ConfigError(f"sr_ppo needs k >= 1 and 0 <= lam <= 1 (got {k}, {lam})")
    if batch.values is None or batch.rewards is None:
        raise ConfigError("advantage 'sr_ppo' needs batch.values and batch.rewards (a critic and a scored batch)")
    mask = batch.loss_mask
    g = torch.where(mask > 0, pass_at_k(batch.values.detach().float(), k), torch.zeros_like(mask))
    terminal = last_token_rewards(pass_at_k(batch.rewards.float(), k), mask)
    adv, _ = gae_advantages_and_returns(terminal, g, mask, 1.0, lam)
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv.float(), broadcast_to_tokens(batch.rewards.float(), mask)
