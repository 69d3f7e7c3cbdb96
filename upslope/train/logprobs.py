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
          temperature: float, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                   *, chunk_rows: int = 1024, temperature: float = 1.0,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token t | < t) and the entropy of that distribution, as [N, L] tensors aligned
    to the token, computed where `target_mask` is set (0 elsewhere). Entropy is detached
    unless `entropy_grad` (for an entropy bonus in the loss)."""
    n, length = input_ids.shape
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    hidden = body(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False).last_hidden_state
    select = target_mask[:, 1:] > 0
    h = hidden[:, :-1][select]
    targets = input_ids[:, 1:][select]
    flat_lp, flat_ent = _chunked_head(model, h, targets, chunk_rows, temperature, entropy_grad)
    zeros = torch.zeros(n, length - 1, dtype=torch.float32, device=input_ids.device)
    lp_full = zeros.masked_scatter(select, flat_lp)
    ent_full = zeros.masked_scatter(select, flat_ent)
    pad = torch.zeros(n, 1, dtype=torch.float32, device=input_ids.device)
    return torch.cat([pad, lp_full], 1), torch.cat([pad, ent_full], 1)


def _chunked_head(model: Any, h: torch.Tensor, targets: torch.Tensor, chunk_rows: int,
                  temperature: float, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    grad = torch.is_grad_enabled() and weight.requires_grad
    lps, ents = [], []
    for s in range(0, h.shape[0], chunk_rows):
        args = (h[s:s + chunk_rows], weight, bias, targets[s:s + chunk_rows], temperature, entropy_grad)
        lp, ent = checkpoint(_head, *args, use_reentrant=False) if grad else _head(*args)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = h.new_zeros(0, dtype=torch.float32)
        return empty, empty
    ent = torch.cat(ents)
    return torch.cat(lps), ent if entropy_grad else ent.detach()


def same_prompt_within_groups(input_ids: torch.Tensor, prompt_lens: torch.Tensor, group_ids: torch.Tensor) -> bool:
    """True when every row of a group starts with the same prompt tokens."""
    for g in group_ids.unique():
        rows = torch.nonzero(group_ids == g).flatten()
        plen = int(prompt_lens[rows[0]])
        if not bool((prompt_lens[rows] == plen).all()):
            return False
        if not bool((input_ids[rows, :plen] == input_ids[rows[0], :plen]).all()):
            return False
    return True


def token_logprobs_shared_prompt(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                 target_mask: torch.Tensor, prompt_lens: torch.Tensor, seq_lens: torch.Tensor,
                                 group_ids: torch.Tensor, *, chunk_rows: int = 1024, temperature: float = 1.0,
                                 entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `token_logprobs`, but each group's prompt runs through the model once and its
    KV cache is shared by the group's completions (gradients flow through the cache): a
    group of n samples costs P + n*C tokens instead of n*(P + C). Only completion tokens
    (positions >= prompt length) can be targets."""
    from transformers import DynamicCache

    n, length = input_ids.shape
    dev = input_ids.device
    groups, row_group = torch.unique(group_ids, return_inverse=True)
    first_row = torch.stack([torch.nonzero(group_ids == g).flatten()[0] for g in groups])
    plens = prompt_lens[first_row]
    pmax = int(plens.max())
    # prompts, left-padded so that every prompt ends at the same column
    cols = torch.arange(pmax, device=dev)
    src = (cols.unsqueeze(0) - (pmax - plens).unsqueeze(1))
    p_att = (src >= 0).long()
    p_ids = input_ids[first_row].gather(1, src.clamp(min=0)) * p_att
    p_pos = (p_att.cumsum(-1) - 1).clamp(min=0)
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    cache = DynamicCache()
    p_hidden = body(input_ids=p_ids, attention_mask=p_att, position_ids=p_pos, past_key_values=cache,
                    use_cache=True).last_hidden_state
    for layer in cache.layers:  # one cache row per sample
        layer.keys = layer.keys[row_group]
        layer.values = layer.values[row_group]
    # completions, right-padded after the prompt
    clens = seq_lens - prompt_lens
    cmax = int(clens.max())
    ccols = torch.arange(cmax, device=dev)
    c_src = (prompt_lens.unsqueeze(1) + ccols.unsqueeze(0)).clamp(max=length - 1)
    c_att = (ccols.unsqueeze(0) < clens.unsqueeze(1)).long()
    c_ids = input_ids.gather(1, c_src) * c_att
    c_pos = plens[row_group].unsqueeze(1) + ccols.unsqueeze(0)
    full_att = torch.cat([p_att[row_group], c_att], 1)
    c_hidden = body(input_ids=c_ids, attention_mask=full_att, position_ids=c_pos, past_key_values=cache,
                    use_cache=True).last_hidden_state
    # the state predicting completion token t: the prompt's last state for t = 0, else completion t-1
    h = torch.cat([p_hidden[row_group, -1:], c_hidden[:, :-1]], 1)
    c_target = target_mask.gather(1, c_src) * c_att > 0
    lp, ent = _chunked_head(model, h[c_target], c_ids[c_target], chunk_rows, temperature, entropy_grad)
    out_lp = torch.zeros(n, length, dtype=torch.float32, device=dev)
    out_ent = torch.zeros(n, length, dtype=torch.float32, device=dev)
    rows, cpos = torch.nonzero(c_target, as_tuple=True)
    flat_index = rows * length + prompt_lens[rows] + cpos
    out_lp = out_lp.flatten().index_put((flat_index,), lp).view(n, length)
    out_ent = out_ent.flatten().index_put((flat_index,), ent).view(n, length)
    return out_lp, out_ent
