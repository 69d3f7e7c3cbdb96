"""Per-token log-probs and entropy without a full [batch, time, vocab] logits tensor.

The LM head runs only at the positions whose next token is trained (completion tokens,
not prompt or padding), in chunks of rows, so at most one chunk of logits is alive at a
time in forward and in backward. The common case (log-probs with gradient, entropy as a
metric) is one autograd function whose backward recomputes each chunk's logits and turns
them into the gradient in place; the rest (entropy gradient, gathered ids, top-k) runs
each chunk under activation checkpointing. Besides the
log-prob of each token, the head can return log-probs at other given token ids ([N, L, K],
e.g. a teacher's candidates) and the model's own top-k tokens (distillation).

A MoE model's forward can replay the experts the sampler routed each token to (`routed_experts`, the
prompt's tokens included: their routing made the prompt's keys and values) and return its routers'
load-balancing loss (`router_aux`); both act in every path (rows, shared prompt, checkpointed layers,
the model's own forward), and neither costs anything when not asked for.

The head is read from the model, not assumed: its weight and bias, and the transforms some
families apply to the logits (Gemma 2/3's final soft-capping, Cohere's logit scale, Falcon-H1's
head multiplier, Granite's logit scaling). Before a model's first use the fast head is checked once against the model's own
forward on hidden states large enough for such transforms to act; a model whose head does
something else is scored through its own full forward instead, with one line saying so.
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from upslope import routing
from upslope.distributed import shard
from upslope.models import decoder_body
from upslope.train.learner import mixers, packing
from upslope.train.learner.amp import replay_autocast, save_autocast


@dataclass
class HeadOutput:
    """The head's outputs, aligned to the token (value at [i, t] is about predicting token t)
    and 0 where the target mask is 0."""

    logprobs: torch.Tensor  # [N, L] log p(token t | < t)
    entropy: torch.Tensor  # [N, L] entropy of that distribution
    gathered: torch.Tensor | None = None  # [N, L, K] log-probs at the requested ids
    topk_logprobs: torch.Tensor | None = None  # [N, L, K] the model's K most likely tokens: log-probs
    topk_ids: torch.Tensor | None = None  # [N, L, K] ... and their ids
    router_aux_loss: torch.Tensor | None = None  # 0-d: the MoE routers' load-balancing loss (with gradient)


@dataclass(frozen=True)
class HeadTransform:
    """What a family's LM head does to `h W^T + b` before the softmax: multiply by `scale`, then
    soft-cap to (-softcap, softcap) as `softcap * tanh(z / softcap)`."""

    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, model: Any) -> "HeadTransform":
        """The transform `model`'s config declares (Cohere's `logit_scale` and Falcon-H1's `lm_head_multiplier`
        multiply, Granite's `logits_scaling` divides, Gemma's `final_logit_softcapping` caps)."""
        config = getattr(model, "config", None)
        if config is None:  # a bare module with a head (no transformers config): the plain linear head
            return cls()
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        scale = (float(getattr(config, "logit_scale", None) or 1.0) * float(getattr(config, "lm_head_multiplier", None) or 1.0)
                 / float(getattr(config, "logits_scaling", None) or 1.0))
        cap = getattr(config, "final_logit_softcapping", None)
        return cls(scale, float(cap) if cap else None)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """The transformed logits (differentiable; `z` is not changed)."""
        if self.scale != 1.0:
            z = z * self.scale
        return torch.tanh(z / self.softcap) * self.softcap if self.softcap else z

    def apply_(self, z: torch.Tensor) -> torch.Tensor | None:
        """Transform `z` in place; returns d(out)/d(in) elementwise when it is not a constant (soft-capping)."""
        if self.scale != 1.0:
            z.mul_(self.scale)
        if not self.softcap:
            return None
        z.div_(self.softcap).tanh_()
        slope = 1 - z.square()
        z.mul_(self.softcap)
        return slope.mul_(self.scale)


@dataclass(frozen=True)
class Truncation:
    """The sampler's truncation of the distribution (after the temperature): the `top_k` largest logits,
    then the smallest set of them holding `top_p` of the mass, as transformers' and vLLM's samplers keep.
    Log-probs under a truncation are those of the renormalised kept set, which is what the engines report
    (vLLM's processed log-probs, transformers' processed scores); the sampled token is always kept."""

    top_p: float = 1.0
    top_k: int = 0

    @property
    def active(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0

    def keep(self, z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """bool [rows, vocab]: the tokens each row's sampler could draw (fp32 logits `z`, temperature applied)."""
        keep = torch.ones_like(z, dtype=torch.bool)
        if 0 < self.top_k < z.shape[-1]:
            keep = z >= z.topk(self.top_k, dim=-1).values[:, -1:]
        if self.top_p < 1.0:
            ordered, index = z.masked_fill(~keep, float("-inf")).sort(dim=-1)  # ascending
            drop = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            drop[:, -1] = False  # the most likely token always stays
            keep &= ~torch.zeros_like(drop).scatter_(-1, index, drop)
        keep[torch.arange(z.shape[0], device=z.device), targets] = True
        return keep


def _head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
          temperature: float, entropy_grad: bool = False, gather_ids: torch.Tensor | None = None,
          top_k: int = 0, top_k_vocab: int | None = None, transform: HeadTransform = HeadTransform(),
          truncation: Truncation = Truncation()) -> tuple[torch.Tensor, ...]:
    return _scores(transform(torch.nn.functional.linear(hidden, weight, bias).float()), targets, temperature,
                   entropy_grad, gather_ids, top_k, top_k_vocab, truncation)


def _scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy_grad: bool = False,
            gather_ids: torch.Tensor | None = None, top_k: int = 0, top_k_vocab: int | None = None,
            truncation: Truncation = Truncation()) -> tuple[torch.Tensor, ...]:
    """(log-prob of each target, entropy, log-probs at `gather_ids`, top-k log-probs and ids) of fp32 logit
    rows, under the temperature and the sampler's truncation."""
    if temperature != 1.0:
        logits = logits / temperature
    if truncation.active:
        logits = logits.masked_fill(~truncation.keep(logits.detach(), targets), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - torch.where(probs > 0, probs * logits, 0.0).sum(-1)
    gathered = logits.gather(-1, gather_ids) - lse.unsqueeze(-1) if gather_ids is not None else None
    topk_lp = topk_ids = None
    if top_k:
        vals, topk_ids = logits[:, :top_k_vocab].topk(top_k, dim=-1)
        topk_lp = vals - lse.unsqueeze(-1)
    return logp, entropy, gathered, topk_lp, topk_ids


def token_scores(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor, *,
                 shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, chunk_rows: int = 1024,
                 temperature: float = 1.0, entropy_grad: bool = False, gather_ids: torch.Tensor | None = None,
                 top_k: int = 0, top_k_vocab: int | None = None, checkpoint_layers: bool = False,
                 truncation: Truncation = Truncation(), routed_experts: torch.Tensor | None = None,
                 router_aux: bool = False, packed: bool = False) -> HeadOutput:
    """Log-prob and entropy of every token where `target_mask` is set (under `temperature` and the
    sampler's `truncation`: the distribution the engine drew from); with `gather_ids`
    [N, L, K] also the log-probs at those ids, with `top_k` the model's own top-k (ids and
    log-probs; among the first `top_k_vocab` ids when given). `shared` = (prompt_lens,
    seq_lens, group_ids) runs each group's prompt once (see token_logprobs_shared_prompt).
    `checkpoint_layers` keeps only each decoder layer's input for backward and recomputes
    the layer there (with `shared`: the completion pass; the shared prompts are short). `packed` runs
    the rows (each group's prompt once with `shared`) as one padding-free sequence (see packing.py).
    A MoE model routes each token through `routed_experts` [N, L, MoE layers, experts per token]
    where recorded (`upslope.routing`), and with `router_aux` the output holds its routers'
    load-balancing loss over every token the forward ran (each group's prompt once when shared)."""
    fast = fast_head_matches(model)  # (its one-time check runs the model: before any router is watched)
    with _routers_watched(model, router_aux) as logits:
        if not fast:
            out = _model_scores(model, input_ids, attention_mask, target_mask, temperature, entropy_grad, gather_ids,
                                top_k, top_k_vocab, truncation, routed_experts, logits)
        else:
            out = _fast_scores(model, input_ids, attention_mask, target_mask, shared, chunk_rows, temperature,
                               entropy_grad, gather_ids, top_k, top_k_vocab, checkpoint_layers, truncation,
                               routed_experts, logits, packed)
    if logits is not None:
        out.router_aux_loss = logits.load_balancing_loss(*routing.expert_counts(model))
    return out


@contextlib.contextmanager
def _routers_watched(model: Any, enabled: bool) -> Iterator[routing.RouterLogits | None]:
    """The model's router logits kept through the block when `enabled` (else None, and nothing is hooked)."""
    if not enabled:
        yield None
        return
    with routing.router_logits(model) as logits:
        yield logits


@contextlib.contextmanager
def _body_call(model: Any, experts: torch.Tensor | None, logits: routing.RouterLogits | None,
               real: torch.Tensor) -> Iterator[None]:
    """Around one forward of the model over [batch, seq] tokens whose real ones `real` marks: their
    recorded experts replayed (None: none), and the mask of that call kept beside its router logits."""
    if logits is not None:
        logits.masks.append(real.reshape(-1))
    with routing.replaying(model, experts):
        yield


def _fast_scores(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                 shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, chunk_rows: int, temperature: float,
                 entropy_grad: bool, gather_ids: torch.Tensor | None, top_k: int, top_k_vocab: int | None,
                 checkpoint_layers: bool, truncation: Truncation, routed_experts: torch.Tensor | None,
                 logits: routing.RouterLogits | None, packed: bool = False) -> HeadOutput:
    """`token_scores` through the decoder body and the chunked head."""
    n, length = input_ids.shape
    if shared is not None and mixers.sets_aside(model, "train.share_prompt"):
        shared = None
    if packed and (routed_experts is not None or logits is not None):
        _say_once(model, "train.packing: routing replay and the router loss run padded micro-batches")
        packed = False
    states = packing.packed_or_none(model, decoder_body(model), checkpointed_layers(model, checkpoint_layers), input_ids,
                                    attention_mask, target_mask, shared) if packed else None
    if states is not None:
        h, targets, flat_index = states
    elif shared is None:
        with checkpointed_layers(model, checkpoint_layers), _body_call(model, routed_experts, logits, attention_mask):
            h, targets, flat_index = _row_states(model, input_ids, attention_mask, target_mask)
    else:
        h, targets, flat_index = _shared_prompt_states(model, input_ids, attention_mask, target_mask, *shared,
                                                       checkpoint_layers=checkpoint_layers,
                                                       routed_experts=routed_experts, logits=logits)
    flat_gather = gather_ids.reshape(n * length, -1)[flat_index] if gather_ids is not None else None
    outs = _chunked_head(model, h, targets, chunk_rows, temperature, entropy_grad, flat_gather, top_k, top_k_vocab,
                         truncation)
    lp, ent, gathered, topk_lp, topk_ids = (_place(o, flat_index, n, length) for o in outs)
    assert lp is not None and ent is not None
    return HeadOutput(lp, ent, gathered, topk_lp, topk_ids)


_HEAD_CHECKED: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_SAID: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def _say_once(model: Any, line: str) -> None:
    """A warning said once per model."""
    said = _SAID.setdefault(model, set())
    if line not in said:
        said.add(line)
        _log.warning(line)


_log = logging.getLogger("upslope")


def fast_head_matches(model: Any) -> bool:
    """Whether the chunked head (the output embedding's weight and bias, then `HeadTransform.of(model)`)
    gives `model`'s own logits; checked once per model (a transformers model in one process: a sharded or
    wrapped model is trusted). The check feeds the model's head random hidden states scaled so that its
    logits spread over about +-40 (where a soft-cap or a scale shows) and compares the log-softmax of
    what the model's forward returns with the fast head's. A mismatch is said once, in one line.

    A sharded model is skipped: inside its FSDP forward the head's weight is a plain, gathered tensor, and the
    check's own forward of the root would free that gather under it (a frozen model reshards after every
    forward); every rank skips alike, so the ranks take the same path."""
    if model in _HEAD_CHECKED:
        return _HEAD_CHECKED[model]
    ok = True
    from transformers import PreTrainedModel

    from torch.distributed.tensor import DTensor

    weight = getattr(model.get_output_embeddings(), "weight", None)
    if (isinstance(model, PreTrainedModel) and isinstance(weight, torch.Tensor) and not isinstance(weight, DTensor)
            and not shard.is_sharded(model)):
        gap = _head_gap(model)
        ok = gap <= (1e-3 if weight.dtype in (torch.float32, torch.float64) else 0.5)
        if not ok:
            _log.warning(f"{type(model).__name__}: the learner's fast LM head does not reproduce this model's logits "
                         f"(log-probs {gap:.2g} apart); scoring through the model's own forward (more memory)")
    _HEAD_CHECKED[model] = ok
    return ok


def _head_gap(model: Any) -> float:
    """max |log-softmax(model's own logits) - log-softmax(fast head)| over 8 random hidden states."""
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        h = torch.randn(1, 8, weight.shape[1], generator=gen).to(weight)  # cpu: drawn on the CPU, then moved
        h = h * (20.0 / torch.nn.functional.linear(h, weight, bias).float().std().clamp(min=1e-6))
        ids = torch.arange(8, device=weight.device).unsqueeze(0) % weight.shape[0]

        def replace(module: Any, args: Any, out: Any) -> Any:
            if isinstance(out, tuple):
                return (h, *out[1:])
            out.last_hidden_state = h
            return out

        hook = decoder_body(model).register_forward_hook(replace)
        try:
            own = model(input_ids=ids, use_cache=False).logits.float()
        finally:
            hook.remove()
        fast = HeadTransform.of(model)(torch.nn.functional.linear(h, weight, bias).float())
        return float((torch.log_softmax(own, -1) - torch.log_softmax(fast, -1)).abs().max())


def _model_scores(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                  temperature: float, entropy_grad: bool, gather_ids: torch.Tensor | None, top_k: int,
                  top_k_vocab: int | None, truncation: Truncation = Truncation(),
                  routed_experts: torch.Tensor | None = None,
                  router_logits: routing.RouterLogits | None = None) -> HeadOutput:
    """`token_scores` through the model's own forward: the full [N, L, vocab] logits, for a head the fast
    path cannot reproduce."""
    n, length = input_ids.shape
    with _body_call(model, routed_experts, router_logits, attention_mask):
        logits = model(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False).logits
    rows, cols = torch.nonzero(target_mask[:, 1:] > 0, as_tuple=True)
    flat_index = rows * length + cols + 1
    flat_gather = gather_ids.reshape(n * length, -1)[flat_index] if gather_ids is not None else None
    outs = list(_scores(logits[rows, cols].float(), input_ids[rows, cols + 1], temperature, entropy_grad, flat_gather,
                        top_k, top_k_vocab, truncation))
    if not entropy_grad:
        outs[1] = outs[1].detach()
    lp, ent, gathered, topk_lp, topk_ids = (_place(o, flat_index, n, length) for o in outs)
    assert lp is not None and ent is not None
    return HeadOutput(lp, ent, gathered, topk_lp, topk_ids)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor,
                   *, chunk_rows: int = 1024, temperature: float = 1.0,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token t | < t) and the entropy of that distribution, as [N, L] tensors aligned
    to the token, computed where `target_mask` is set (0 elsewhere). Entropy is detached
    unless `entropy_grad` (for an entropy bonus in the loss)."""
    out = token_scores(model, input_ids, attention_mask, target_mask, chunk_rows=chunk_rows,
                       temperature=temperature, entropy_grad=entropy_grad)
    return out.logprobs, out.entropy


def _place(flat: torch.Tensor | None, flat_index: torch.Tensor, n: int, length: int) -> torch.Tensor | None:
    """Rows of a flat per-position tensor put back at their [N, L] token positions (0 elsewhere)."""
    if flat is None:
        return None
    zeros = flat.new_zeros((n * length, *flat.shape[1:]))
    return zeros.index_put((flat_index,), flat).view(n, length, *flat.shape[1:])


def _row_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                target_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states predicting each target token, the targets, and their flat [N * L] positions."""
    length = input_ids.shape[1]
    hidden = decoder_body(model)(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False).last_hidden_state
    rows, cols = torch.nonzero(target_mask[:, 1:] > 0, as_tuple=True)  # the state at t predicts token t + 1
    return hidden[rows, cols], input_ids[rows, cols + 1], rows * length + cols + 1


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in at least fp32 (the softmax of a 49k vocabulary is not done in bf16)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


class _LinearLogprob(torch.autograd.Function):
    """(log p(target), entropy) of each row of `h` under softmax(f(h W^T + b) / T), f the head's
    transform, chunk by chunk. Saves only h, the targets and each row's log-normaliser; backward recomputes a
    chunk's logits, turns them into d logp / d logits = g (onehot - softmax) in place, and
    accumulates dh and dW from it. The entropy is a metric: it gets no gradient."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, chunk_rows: int, transform: HeadTransform,
                truncation: Truncation = Truncation()) -> tuple[torch.Tensor, torch.Tensor]:
        save_autocast(ctx, h)
        logp, ent, lse = [], [], []
        for s in range(0, h.shape[0], chunk_rows):
            logits = _wide(torch.nn.functional.linear(h[s:s + chunk_rows], weight, bias))
            transform.apply_(logits)
            if temperature != 1.0:
                logits.div_(temperature)
            if truncation.active:
                logits.masked_fill_(~truncation.keep(logits, targets[s:s + chunk_rows]), float("-inf"))
            norm = torch.logsumexp(logits, dim=-1)
            logits.sub_(norm.unsqueeze(-1))  # log-softmax, in place
            logp.append(logits.gather(-1, targets[s:s + chunk_rows].unsqueeze(-1)).squeeze(-1))
            ent.append(torch.special.entr(logits.exp()).sum(-1) if truncation.active else -(logits.exp() * logits).sum(-1))
            lse.append(norm)
        ctx.save_for_backward(h, weight, bias, targets, torch.cat(lse))
        ctx.temperature, ctx.chunk_rows, ctx.transform, ctx.truncation = temperature, chunk_rows, transform, truncation
        entropy = torch.cat(ent)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logp), entropy

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor | None) -> tuple[Any, ...]:
        with replay_autocast(ctx):
            return _LinearLogprob._backward(ctx, g_logp)

    @staticmethod
    def _backward(ctx: Any, g_logp: torch.Tensor) -> tuple[Any, ...]:
        h, weight, bias, targets, lse = ctx.saved_tensors
        temperature, chunk_rows, transform, truncation = ctx.temperature, ctx.chunk_rows, ctx.transform, ctx.truncation
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dh = torch.empty_like(h) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)
        dw: torch.Tensor | None = None  # no [vocab, hidden] fp32 buffer for bf16 weights
        db = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b and bias is not None else None
        dtype = ctx.amp_dtype or h.dtype
        w_low = weight.to(dtype)
        for s in range(0, h.shape[0], chunk_rows):
            hc, g = h[s:s + chunk_rows].to(dtype), _wide(g_logp[s:s + chunk_rows])
            logits = _wide(torch.nn.functional.linear(hc, w_low, bias))
            slope = transform.apply_(logits)
            if temperature != 1.0:
                logits.div_(temperature)
            if truncation.active:  # the kept set is a constant of the logits: no gradient outside it
                logits.masked_fill_(~truncation.keep(logits, targets[s:s + chunk_rows]), float("-inf"))
            grad = logits.sub_(lse[s:s + chunk_rows].unsqueeze(-1)).exp_().mul_(-g.unsqueeze(-1))  # -g * softmax
            rows = torch.arange(grad.shape[0], device=grad.device)
            grad[rows, targets[s:s + chunk_rows]] += g  # + g * onehot
            if temperature != 1.0:
                grad.div_(temperature)
            if slope is not None:  # back through the soft-cap (and the scale before it)
                grad.mul_(slope)
            elif transform.scale != 1.0:
                grad.mul_(transform.scale)
            low = grad.to(dtype)
            if dh is not None:
                dh[s:s + chunk_rows] = low @ w_low
            if need_w:
                part = (low.t() @ hc).to(weight.dtype)  # summed in the weight's dtype (fp32 for fp32 weights)
                dw = part if dw is None else dw.add_(part)
            if db is not None:
                db.add_(grad.sum(0))
        return dh, dw, db.to(bias.dtype) if db is not None else None, None, None, None, None, None  # (h has >= 1 row)


def _chunked_head(model: Any, h: torch.Tensor, targets: torch.Tensor, chunk_rows: int, temperature: float,
                  entropy_grad: bool = False, gather_ids: torch.Tensor | None = None, top_k: int = 0,
                  top_k_vocab: int | None = None,
                  truncation: Truncation = Truncation()) -> tuple[torch.Tensor | None, ...]:
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    transform = HeadTransform.of(model)
    grad = torch.is_grad_enabled() and (weight.requires_grad or h.requires_grad)
    if grad and not entropy_grad and gather_ids is None and not top_k and h.shape[0]:
        logp, entropy = _LinearLogprob.apply(h, weight, bias, targets, temperature, chunk_rows, transform, truncation)
        return logp, entropy, None, None, None
    parts: list[tuple[torch.Tensor | None, ...]] = []
    for s in range(0, h.shape[0], chunk_rows):
        g = gather_ids[s:s + chunk_rows] if gather_ids is not None else None
        args = (h[s:s + chunk_rows], weight, bias, targets[s:s + chunk_rows], temperature, entropy_grad, g, top_k,
                top_k_vocab, transform, truncation)
        parts.append(checkpoint(_head, *args, use_reentrant=False) if grad else _head(*args))
    if not parts:
        k = gather_ids.shape[1] if gather_ids is not None else 0
        empty = h.new_zeros(0, dtype=torch.float32)
        return (empty, empty, h.new_zeros(0, k, dtype=torch.float32) if gather_ids is not None else None,
                h.new_zeros(0, top_k, dtype=torch.float32) if top_k else None,
                h.new_zeros(0, top_k, dtype=torch.long) if top_k else None)
    out = [torch.cat(col) if col[0] is not None else None for col in zip(*parts)]
    if not entropy_grad:
        out[1] = out[1].detach()
    return tuple(out)


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
    out = token_scores(model, input_ids, attention_mask, target_mask, shared=(prompt_lens, seq_lens, group_ids),
                       chunk_rows=chunk_rows, temperature=temperature, entropy_grad=entropy_grad)
    return out.logprobs, out.entropy


@contextlib.contextmanager
def checkpointed_layers(model: Any, enabled: bool = True) -> Iterator[None]:
    """Within the block (and with gradients on), each decoder layer of `model` keeps only its
    inputs for backward and runs again there (activation checkpointing per layer). Unlike
    HF's gradient checkpointing it leaves a passed KV cache in place, so the shared-prompt
    forward keeps working; the cache must not change between the two runs (`_PrefixCache`)."""
    layers = getattr(decoder_body(model), "layers", None)
    if not enabled or not torch.is_grad_enabled() or layers is None:
        yield
        return
    own = [layer.__dict__.get("forward") for layer in layers]
    for layer in layers:
        def run(*args: Any, _forward: Any = layer.forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False,
                              context_fn=routing.same_routing_when_recomputed, **kwargs)
        layer.forward = run
    try:
        yield
    finally:
        for layer, forward in zip(layers, own):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward


def _prefix_cache(cache: Any) -> Any:
    """The prompts' filled KV cache as a read-only prefix: a layer gets the prompt's keys and
    values followed by its own, and the cache stays as it was (so a checkpointed layer that
    runs again in backward sees the same prefix)."""
    from transformers import DynamicCache

    class _PrefixCache(DynamicCache):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)

    prefix = _PrefixCache()
    prefix.layers = cache.layers
    return prefix


def _shared_prompt_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          target_mask: torch.Tensor, prompt_lens: torch.Tensor, seq_lens: torch.Tensor,
                          group_ids: torch.Tensor, checkpoint_layers: bool = False,
                          routed_experts: torch.Tensor | None = None, logits: routing.RouterLogits | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_row_states` with each group's prompt forwarded once and its KV cache shared (a group's prompt
    replays the routing recorded for its first sample)."""
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
    body = decoder_body(model)
    cache = DynamicCache()
    p_experts = _placed_experts(routed_experts, first_row.unsqueeze(1), src, p_att)
    with _body_call(model, p_experts, logits, p_att):
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
    c_experts = _placed_experts(routed_experts, torch.arange(n, device=dev).unsqueeze(1), c_src, c_att)
    with checkpointed_layers(model, checkpoint_layers), _body_call(model, c_experts, logits, c_att):
        c_hidden = body(input_ids=c_ids, attention_mask=full_att, position_ids=c_pos,
                        past_key_values=_prefix_cache(cache), use_cache=True).last_hidden_state
    # the state predicting completion token t: the prompt's last state for t = 0, else completion t-1
    h = torch.cat([p_hidden[row_group, -1:], c_hidden[:, :-1]], 1)
    c_target = target_mask.gather(1, c_src) * c_att > 0
    rows, cpos = torch.nonzero(c_target, as_tuple=True)
    return h[c_target], c_ids[c_target], rows * length + prompt_lens[rows] + cpos


def _placed_experts(experts: torch.Tensor | None, rows: torch.Tensor, cols: torch.Tensor,
                    real: torch.Tensor) -> torch.Tensor | None:
    """The recorded experts of the tokens at (rows, cols) of the batch ([r, c, MoE layers, k]), NOT_ROUTED
    where `real` is 0 (padding)."""
    if experts is None:
        return None
    placed = experts[rows, cols.clamp(min=0)]
    return placed.masked_fill(~real.bool()[..., None, None], routing.NOT_ROUTED)
