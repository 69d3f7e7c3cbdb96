"""Reduce a per-token loss [N, L] to the scalar to backpropagate, accumulation-correct.

Every mode is a *sum* over rows divided by a normaliser of the whole optimiser
mini-batch (not of the micro-batch), so summing `aggregate` over the micro-batches of a
split gives exactly `aggregate` over the whole: call `loss_normalizers` once on the
mini-batch's mask and pass its numbers to every micro-batch. When the mini-batch arrives in
pieces and its counts are known only at the end (the streamed update), aggregate each piece
with `UNIT` counts and divide the summed result (or its gradient) by `normalizer` once.
"""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.errors import ConfigError

MODES = ("token_mean", "seq_mean_token_mean", "seq_sum_constant")


def loss_normalizers(mask: Tensor) -> dict[str, float]:
    """num_tokens (trained tokens) and num_seqs (rows with at least one trained token) of a whole mini-batch."""
    valid = mask > 0
    return {"num_tokens": float(valid.sum().item()), "num_seqs": float(valid.any(dim=1).sum().item())}


UNIT = {"num_tokens": 1.0, "num_seqs": 1.0}  # counts that leave `aggregate` un-normalised


def normalizer(mode: str, *, num_tokens: float, num_seqs: float) -> float:
    """The mini-batch divisor of `aggregate`: aggregate(x, counts) = aggregate(x, UNIT) / normalizer(counts)
    (up to float rounding) for every mode; seq_sum_constant's constant stays inside `aggregate`."""
    if mode == "token_mean":
        return max(float(num_tokens), 1.0)
    if mode in ("seq_mean_token_mean", "seq_sum_constant"):
        return max(float(num_seqs), 1.0)
    raise ConfigError(f"unknown loss aggregation '{mode}'; known: {', '.join(MODES)}")


def aggregate(per_token_loss: Tensor, mask: Tensor, mode: str, *, num_tokens: float, num_seqs: float,
              constant: float | None = None) -> Tensor:
    """Scalar loss: token_mean (DAPO), seq_mean_token_mean (GRPO paper, GSPO) or seq_sum_constant (Dr. GRPO).

    token_mean:          sum(loss * mask) / num_tokens
    seq_mean_token_mean: sum_i [ sum_t loss_it m_it / sum_t m_it ] / num_seqs
    seq_sum_constant:    sum(loss * mask) / (num_seqs * constant), constant e.g. max_new_tokens
    Masked positions contribute neither value nor gradient (even if they hold inf/NaN).
    """
    valid = mask > 0
    loss = torch.where(valid, per_token_loss, torch.zeros_like(per_token_loss))
    if mode == "token_mean":
        return loss.sum() / max(float(num_tokens), 1.0)
    if mode == "seq_mean_token_mean":
        per_row = loss.sum(dim=1) / valid.sum(dim=1).clamp(min=1).to(loss.dtype)
        return per_row.sum() / max(float(num_seqs), 1.0)
    if mode == "seq_sum_constant":
        if constant is None or constant <= 0:
            raise ConfigError(f"loss aggregation 'seq_sum_constant' needs a positive constant (got {constant})")
        return loss.sum() / (max(float(num_seqs), 1.0) * float(constant))
    raise ConfigError(f"unknown loss aggregation '{mode}'; known: {', '.join(MODES)}")
