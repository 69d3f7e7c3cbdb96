"""Supervised losses on the trained tokens: negative log-likelihood, and DFT.

DFT (Dynamic Fine-Tuning, Wu et al. 2025, "On the Generalization of SFT") multiplies each
token's NLL by the token's probability under the model, detached: -sg(p) log p. Its gradient
is p times the NLL gradient, so tokens the model finds unlikely pull less (SFT's gradient is
a policy gradient with reward 1/p; DFT cancels that weight). With p -> 1 the two agree.
"""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import masked_mean


def sft_token_loss(logprobs: Tensor, mask: Tensor, *, dft: bool = False) -> Tensor:
    """Per-token loss [N, L]: -log p (NLL), or -sg(p) log p (DFT); exactly 0 where mask is 0."""
    nll = -logprobs
    if dft:
        nll = nll * logprobs.detach().exp()
    return torch.where(mask > 0, nll, torch.zeros_like(nll))


def sft_loss(logprobs: Tensor, mask: Tensor, *, num_tokens: float,
             dft: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-mean loss over the trained tokens: the sum over this (micro-)batch divided by the
    whole mini-batch's `num_tokens`, so micro-batch losses add up to the mini-batch's. Metrics:
    per-token NLL and probability of the trained tokens (detached)."""
    loss = sft_token_loss(logprobs, mask, dft=dft).sum() / max(float(num_tokens), 1.0)
    lp = logprobs.detach().float()
    return loss, {"nll": masked_mean(-lp, mask), "token_prob": masked_mean(lp.exp(), mask)}
