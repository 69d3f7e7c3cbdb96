"""Train/inference mismatch correction: truncated importance sampling (TIS) and masking of outlier ratios.

The sampler's log-probs differ from the learner's even at equal weights (kernels, precision).
With rho = pi_learner_old / pi_sampler, the learner multiplies each token's policy loss by
`weights` (detached) and aggregates with `new_mask` (use `new_mask` for `loss_normalizers` too).

Levels: "token" uses rho_t per token; "sequence" uses the product of token ratios,
exp(sum_t log rho_t) -- the true importance weight of the whole completion, the choice of
"sequence-level TIS" (Yao et al. 2025); "geometric" uses exp(mean_t log rho_t), a
length-independent per-sequence ratio in the spirit of GSPO. Weights are min(rho, cap);
tokens (token level) or whole rows (sequence levels) with rho outside [mask_low, mask_high]
are masked out (weight 0). Everything is computed in log space, so long sequences cannot overflow.
Each token's log rho is clamped to +-20 and inf - inf (both log-probs -inf) counts as 0, as in the
policy losses (`common.clamp_log_ratio`), so no weight or metric is ever NaN.
"""
import math

import torch
from torch import Tensor

from upslope.algos.common import MAX_LOG_RATIO, clamp_log_ratio, masked_mean
from upslope.errors import ConfigError

LEVELS = ("token", "sequence", "geometric")


def importance_correction(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, level: str = "token",
                          cap: float = 2.0, mask_low: float | None = None,
                          mask_high: float | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """(weights [N, L] detached, new_mask [N, L], metrics {capped_frac, masked_frac, mismatch_abs}).

    capped_frac and masked_frac count the level's units: tokens at token level, rows
    (with at least one trained token) at the sequence levels. mismatch_abs is the mean
    |old - sampler| log-prob gap over the trained tokens.
    """
    if level not in LEVELS:
        raise ConfigError(f"importance correction level '{level}' unknown; known: {', '.join(LEVELS)}")
    if cap <= 0 or (mask_low is not None and mask_low <= 0) or (mask_high is not None and mask_high <= 0):
        raise ConfigError("importance correction: cap, mask_low and mask_high must be positive")
    valid = mask > 0
    diff = (old_logprobs - sampler_logprobs).detach()
    diff = diff.to(torch.promote_types(diff.dtype, torch.float32))
    log_rho = torch.where(valid, clamp_log_ratio(diff, MAX_LOG_RATIO), torch.zeros_like(diff))
    if level == "token":
        unit_log, unit_valid = log_rho, valid
    else:
        total = log_rho.sum(dim=1, keepdim=True)
        if level == "geometric":
            total = total / valid.sum(dim=1, keepdim=True).clamp(min=1)
        unit_log, unit_valid = total.expand(log_rho.shape), valid.any(dim=1, keepdim=True)
    keep = torch.ones_like(valid)
    if mask_low is not None:
        keep &= unit_log >= math.log(mask_low)
    if mask_high is not None:
        keep &= unit_log <= math.log(mask_high)
    capped = unit_log > math.log(cap)
    new_mask = torch.where(keep, mask, torch.zeros_like(mask))
    weights = torch.where(keep & valid, torch.exp(unit_log.clamp(max=math.log(cap))), torch.zeros_like(log_rho))
    if level == "token":
        capped_frac, masked_frac = masked_mean(capped.float(), mask), masked_mean((~keep).float(), mask)
    else:
        rows = unit_valid.squeeze(1)
        capped_frac = masked_mean(capped[:, 0].float(), rows)
        masked_frac = masked_mean((~keep[:, 0]).float(), rows)
    metrics = {"capped_frac": capped_frac, "masked_frac": masked_frac, "mismatch_abs": masked_mean(log_rho.abs(), mask)}
    return weights, new_mask, metrics
