"""Per-token salience from the policy's internals, for the salience-weighted advantages (FlowTracer,
ARCA, GRAIL in upslope.algos.credit_salience): one extra pass of the batch before the advantage; and
per-rollout features (`rollout_features` of a FEATURES source) for the advantages that read them: the mean
last-layer hidden state (GEOALIGN in upslope.algos.geometry), the state at every position (Hista, PUM) and how
much a rollout's reasoning raises its answer's log-prob (ISPO in upslope.algos.confidence).

Each returns [N, L] >= 0, aligned to tokens (the value at t is about choosing token t) and 0 off
the trained tokens. The answer region is each row's last `answer_tokens` trained tokens.
Costs (extra forward, attention maps, a backward to the inputs) are measured in docs/methods.md.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from upslope.batch import Batch
from upslope.errors import ConfigError
from upslope.models import decoder_body
from upslope.train.learner.logprobs import token_logprobs


def answer_region(mask: torch.Tensor, answer_tokens: int) -> torch.Tensor:
    """[N, L] bool: each row's last `answer_tokens` trained tokens."""
    on = mask > 0
    from_end = on.flip(1).long().cumsum(1).flip(1)  # trained tokens at or after t
    return on & (from_end <= answer_tokens)


def flow_to_answer(attn: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Attention flow [N, L] into the answer: x_j = [j in answer] + sum_{i > j} x_i A[i, j], A row-stochastic
    ([N, L, L], row i = what token i attends to). Mass only moves along paths that reach the answer, and
    each token passes on exactly what it receives (its attention row sums to 1): flow is conserved."""
    x = answer.to(attn.dtype).clone()
    for j in range(attn.shape[1] - 2, -1, -1):
        x[:, j] = x[:, j] + (x[:, j + 1:] * attn[:, j + 1:, j]).sum(-1)
    return x


def _shift_to_tokens(per_position: torch.Tensor) -> torch.Tensor:
    """A value about the state at position t - 1 (the one that chooses token t) placed at t."""
    return torch.cat([torch.zeros_like(per_position[:, :1]), per_position[:, :-1]], dim=1)


def mean_attention(model: Any, mb: Batch) -> torch.Tensor:
    """[N, L, L]: the attention maps of one eager-attention forward, averaged over layers and heads."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")  # sdpa and flash kernels return no attention maps
    try:
        out = decoder_body(model)(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long(), output_attentions=True,
                           use_cache=False)
    finally:
        model.set_attn_implementation(impl)
    return torch.stack([a.float().mean(1) for a in out.attentions]).mean(0)


@torch.no_grad()
def attention_flow(model: Any, mb: Batch, answer_tokens: int) -> torch.Tensor:
    """FlowTracer's throughput: flow into the answer over the attention DAG (mean over layers and heads)."""
    return flow_to_answer(mean_attention(model, mb), answer_region(mb.loss_mask, answer_tokens))


def attention_shift_of(attn: torch.Tensor) -> torch.Tensor:
    """[N, L]: at t >= 1 the total variation distance between the attention rows of t and t - 1 over the
    positions both see (0 .. t - 1), each renormalised there; 0 at t = 0. A spike marks a pivot: the model
    turning its attention elsewhere."""
    n, length = attn.shape[0], attn.shape[1]
    cols, rows = torch.arange(length, device=attn.device), torch.arange(1, length, device=attn.device)
    seen = cols[None, :] < rows[:, None]  # [L - 1, L]: row t sees the columns before it
    cur, prev = attn[:, 1:] * seen, attn[:, :-1] * seen
    cur = cur / cur.sum(-1, keepdim=True).clamp(min=1e-12)
    prev = prev / prev.sum(-1, keepdim=True).clamp(min=1e-12)
    return torch.cat([torch.zeros(n, 1, dtype=attn.dtype, device=attn.device), 0.5 * (cur - prev).abs().sum(-1)],
                     dim=1)


@torch.no_grad()
def attention_shift(model: Any, mb: Batch, answer_tokens: int) -> torch.Tensor:
    """PivotTrace's attention dynamics: each token's shift of attention from the token before it."""
    return attention_shift_of(mean_attention(model, mb))


@torch.no_grad()
def adapter_residual(model: Any, mb: Batch, answer_tokens: int) -> torch.Tensor:
    """ARCA: ||h_adapted - h_base|| of the last hidden state that chooses each token (LoRA on and off)."""
    from upslope.lora import is_adapted

    if not is_adapted(model):
        raise ConfigError("advantage 'arca' reads the LoRA adapter's residual: set lora.enabled: true")
    kw = dict(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long(), use_cache=False)
    adapted = decoder_body(model)(**kw).last_hidden_state.float()
    with model.disable_adapter():
        base = decoder_body(model)(**kw).last_hidden_state.float()
    return _shift_to_tokens((adapted - base).norm(dim=-1))


def gradient_saliency(model: Any, mb: Batch, answer_tokens: int) -> torch.Tensor:
    """GRAIL: |gradient x input| of the answer's summed log-prob at each input embedding (the weights'
    gradients are not touched: autograd.grad to the embeddings only)."""
    emb = model.get_input_embeddings()(mb.input_ids).detach().requires_grad_(True)
    rows, cols = torch.nonzero(answer_region(mb.loss_mask, answer_tokens)[:, 1:], as_tuple=True)
    with torch.enable_grad():
        h = decoder_body(model)(inputs_embeds=emb, attention_mask=mb.attention_mask.long(), use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(h[rows, cols]).float()  # only the answer's predicting states
        lp = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[rows, cols + 1, None])
        (grad,) = torch.autograd.grad(lp.sum(), emb)
    return (grad * emb).sum(-1).abs().detach()


@torch.no_grad()
def hidden_mean(model: Any, mb: Batch) -> torch.Tensor:
    """[n, D]: each row's last-layer hidden state averaged over the states that choose its trained tokens
    (position t - 1 for token t): one forward of the decoder body, no vocabulary head."""
    h = decoder_body(model)(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long(), use_cache=False)
    h = h.last_hidden_state.float()[:, :-1]
    w = (mb.loss_mask[:, 1:] > 0).to(h.dtype).unsqueeze(-1)
    return (h * w).sum(1) / w.sum(1).clamp(min=1.0)


@torch.no_grad()
def hidden_states(model: Any, mb: Batch) -> torch.Tensor:
    """[n, L, D]: the last-layer hidden state at every position (the state after reading the tokens up to and
    including it), 0 on padding: one forward of the decoder body, no vocabulary head. The prefix through
    token t is summarised at t; token t is chosen by the state at t - 1."""
    h = decoder_body(model)(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long(), use_cache=False)
    return h.last_hidden_state.float() * mb.attention_mask.unsqueeze(-1).float()


def answer_logprob(model: Any, ids: torch.Tensor, attention: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """[n]: the mean log-prob of each row's `answer` tokens ([n, L] bool) given all before them (the learner's
    token_logprobs: the LM head only where an answer token is chosen, each model family's head)."""
    lp = token_logprobs(model, ids, attention, answer.float())[0]
    return (lp * answer).sum(1) / answer[:, 1:].sum(1).clamp(min=1)


@torch.no_grad()
def answer_gain(model: Any, mb: Batch, answer_tokens: int = 4) -> torch.Tensor:
    """[n, 1]: how much a rollout's reasoning raises its answer's probability (ISPO's informativeness): the mean
    log-prob of the answer (its last `answer_tokens` trained tokens) after the prompt and the reasoning, minus
    after the prompt alone (a second forward with the reasoning cut out); 0 for a rollout with no reasoning."""
    answer = answer_region(mb.loss_mask, answer_tokens)
    with_reasoning = answer_logprob(model, mb.input_ids, mb.attention_mask, answer)
    parts = [torch.cat([mb.input_ids[i, :int(mb.prompt_lens[i])], mb.input_ids[i][answer[i]]]) for i in range(mb.size)]
    width = max(len(p) for p in parts)
    ids = torch.zeros(mb.size, width, dtype=mb.input_ids.dtype, device=mb.input_ids.device)
    attention = torch.zeros_like(ids)
    cut = torch.zeros(mb.size, width, dtype=torch.bool, device=ids.device)
    for i, (p, row) in enumerate(zip(mb.prompt_lens.tolist(), parts)):
        ids[i, :len(row)], attention[i, :len(row)], cut[i, int(p):len(row)] = row, 1, True
    alone = answer_logprob(model, ids, attention, cut)
    reasoning = ((mb.loss_mask > 0) & ~answer).any(1)
    return torch.where(reasoning, with_reasoning - alone, torch.zeros_like(alone))[:, None]


from upslope.train.learner.influence import influence  # noqa: E402  (a whole-batch source: gradients, the optimiser)

FEATURES: dict[str, Callable[..., torch.Tensor]] = {"hidden_mean": hidden_mean, "hidden_states": hidden_states,
                                                  "answer_gain": answer_gain, "influence": influence}


def rollout_features(updater: Any, batch: Batch, fn: Callable[..., torch.Tensor], **options: Any) -> torch.Tensor:
    """[N, D] (or, for a per-position source, [N, L, D]) features of each rollout from `fn` (a FEATURES source,
    given `options`, e.g. the advantage's answer_tokens), in the updater's micro-batches, on the CPU; a source
    marked `whole_batch` (INFUSER's influence: gradients across rows) is given the updater and the whole batch."""
    if getattr(fn, "whole_batch", False):
        return fn(updater, batch, **options).float().cpu()
    rows = []
    updater.model.eval()
    try:
        for idx in updater.micro_batches(batch):
            mb = batch.select(idx).to(updater.device)
            with updater.autocast():
                rows.append((torch.as_tensor(idx), fn(updater.model, mb, **options).float().cpu()))
    finally:
        updater.model.train()
    first = rows[0][1] if rows else torch.zeros(0, 0, device="cpu")  # cpu: gathered on the host
    width = batch.input_ids.shape[1:2] if first.dim() == 3 else ()  # [n, L', D]: micro-batches are trimmed
    out = torch.zeros(batch.size, *width, first.shape[-1])  # cpu: the features are gathered on the host
    for idx, feats in rows:
        out[idx, :feats.shape[1]] = feats
    return out


@torch.no_grad()
def prompt_features(updater: Any, prompt_ids: Sequence[list[int]], rows: int = 64) -> torch.Tensor:
    """[P, D]: each prompt's last-layer hidden state averaged over its tokens, `rows` prompts a forward of the
    decoder body (right-padded, padding masked out), on the CPU."""
    model, out = updater.model, []
    model.eval()
    try:
        for s in range(0, len(prompt_ids), rows):
            chunk = prompt_ids[s:s + rows]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([list(p) + [0] * (width - len(p)) for p in chunk], device=updater.device)
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in chunk], device=updater.device)
            with updater.autocast():
                h = decoder_body(model)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state.float()
            m = mask.unsqueeze(-1).to(h.dtype)
            out.append(((h * m).sum(1) / m.sum(1)).cpu())
    finally:
        model.train()
    return torch.cat(out) if out else torch.zeros(0, 0)  # cpu: on the host, as documented


SOURCES: dict[str, Callable[[Any, Batch, int], torch.Tensor]] = {
    "attention_flow": attention_flow, "adapter_residual": adapter_residual, "gradient": gradient_saliency,
    "attention_shift": attention_shift}


def token_salience(updater: Any, batch: Batch, source: str, answer_tokens: int) -> torch.Tensor:
    """[N, L] salience of the batch's trained tokens from `source`, in the updater's micro-batches, on the CPU."""
    fn = SOURCES[source]
    out = torch.zeros(batch.input_ids.shape, device=batch.input_ids.device)  # cpu: the batch lives on the CPU
    updater.model.eval()
    try:
        for idx in updater.micro_batches(batch):
            mb = batch.select(idx).to(updater.device)
            with updater.autocast():
                sal = fn(updater.model, mb, answer_tokens)
            out[torch.as_tensor(idx), :sal.shape[1]] = sal.float().cpu()
    finally:
        updater.model.train()
    return out * batch.loss_mask
