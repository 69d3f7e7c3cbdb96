"""Per-token log-probs and entropy without a full [batch, time, vocab] logits tensor.

The LM head runs only at the positions whose next token is trained (completion tokens,
not prompt or padding), in chunks of rows; with gradients each chunk is checkpointed, so
at most one chunk of logits is alive at a time in forward and in backward.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def _head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
          temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                   *, chunk_rows: int = 1024, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token t | < t) and the entropy of that distribution, as [N, L] tensors aligned
    to the token, computed where `target_mask` is set (0 elsewhere). Entropy is detached."""
    n, length = input_ids.shape
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    hidden = body(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False).last_hidden_state
    select = target_mask[:, 1:] > 0
    h = hidden[:, :-1][select]
    targets = input_ids[:, 1:][select]
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    grad = torch.is_grad_enabled() and weight.requires_grad
    lps, ents = [], []
    for s in range(0, h.shape[0], chunk_rows):
        args = (h[s:s + chunk_rows], weight, bias, targets[s:s + chunk_rows], temperature)
        lp, ent = checkpoint(_head, *args, use_reentrant=False) if grad else _head(*args)
        lps.append(lp)
        ents.append(ent)
    flat_lp = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
    flat_ent = torch.cat(ents) if ents else flat_lp.detach()
    zeros = torch.zeros(n, length - 1, dtype=torch.float32, device=input_ids.device)
    lp_full = zeros.masked_scatter(select, flat_lp)
    ent_full = zeros.masked_scatter(select, flat_ent.detach())
    pad = torch.zeros(n, 1, dtype=torch.float32, device=input_ids.device)
    return torch.cat([pad, lp_full], 1), torch.cat([pad, ent_full], 1)
