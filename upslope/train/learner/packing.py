"""Padding-free forward: a micro-batch's rows packed into one sequence.

The padded forward runs a micro-batch as a [rows, longest row] tensor, so a group with one 512-token
reply and seven 20-token replies costs 8 x 512 tokens. Packed, the same micro-batch is one [1, T]
sequence holding only real tokens: each row's tokens (or, with shared prompts, each group's prompt once
followed by each of its completions), position ids restarting per row, and attention computed block by
block, so that a token attends only to its own row (its group's prompt and its own completion):

    prompt g | completion g.1 | completion g.2 | prompt h | completion h.1 | ...

The attention runs through the model's attention interface: `enable(model)` registers an implementation
that, when the forward carries a `PackPlan` (keyword `upslope_pack`, passed by the decoder layers down to
their attention, and kept by checkpointed layers for the recompute), attends within each block with
PyTorch's scaled-dot-product attention (or the same product written out when the model's own
implementation soft-caps its attention logits: eager does, sdpa does not), and otherwise hands the call to the model's own implementation unchanged. Sliding
windows, grouped-query heads and attention scaling are taken from the call, as the model's own attention
gets them; chunked attention (Llama 4) from the layer's config. Every packed forward checks that each decoder layer's attention saw the plan; a model whose
layers do not pass it is refused in one line rather than attended across rows.
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from upslope.train.learner import mixers

PLAN_KEY = "upslope_pack"
_PREFIX = "upslope_packed_"


class PackingUnsupported(RuntimeError):
    """The model cannot run the packed forward (said in one line; the caller pads instead)."""


@dataclass(frozen=True)
class Block:
    """Tokens [start, end) of the packed sequence, attending causally to themselves after the tokens
    [prefix_start, prefix_end) (their group's shared prompt; an empty range for a row of its own)."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_end: int = 0

    @property
    def prefix(self) -> int:
        return self.prefix_end - self.prefix_start


@dataclass
class PackPlan:
    """The blocks of one packed sequence, in order; `calls` counts the attention calls that used it."""

    blocks: list[Block]
    calls: int = 0
    _masks: dict[tuple[int, int, int | None, int | None, str], torch.Tensor] = field(default_factory=dict)

    def mask(self, block: Block, window: int | None, device: torch.device, chunk: int | None = None
             ) -> torch.Tensor | None:
        """Which keys (the prefix, then the block's own tokens) each of the block's queries may see:
        None for plain causal attention, else a [own, prefix + own] boolean mask (reused across layers).
        `window`: a sliding window; `chunk`: chunked attention (a token sees only its own chunk of the row)."""
        own, prefix = block.end - block.start, block.prefix
        if prefix == 0 and (window is None or own <= window) and (chunk is None or own <= chunk):
            return None
        key = (prefix, own, window, chunk, str(device))
        if key not in self._masks:
            q = torch.arange(own, device=device).unsqueeze(1) + prefix  # positions within the row
            k = torch.arange(prefix + own, device=device).unsqueeze(0)
            allowed = k <= q
            if window is not None:
                allowed &= (q - k) < window
            if chunk is not None:
                allowed &= (q // chunk) == (k // chunk)
            self._masks[key] = allowed
        return self._masks[key]


@dataclass
class Packed:
    """A micro-batch packed into one sequence: its token ids and position ids [1, T], the plan, and
    where each [row, column] of the padded batch sits in the sequence (-1: padding)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    plan: PackPlan
    where: torch.Tensor


def pack(input_ids: torch.Tensor, seq_lens: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor] | None = None
         ) -> Packed:
    """Pack the rows of a right-padded [N, L] batch. With `shared` = (prompt_lens, group_ids), each group's
    prompt (the first row's; the caller checks the group's rows share it) is placed once and the group's
    completions follow it, each attending to it; without, every row is a block of its own."""
    n, length = input_ids.shape
    lens = seq_lens.tolist()
    src_row: list[int] = []  # the packed sequence's tokens: where each comes from, and its position
    src_col: list[int] = []
    blocks: list[Block] = []
    at_row: list[int] = []  # every real [row, col] of the batch: the packed index holding it
    at_col: list[int] = []
    at_index: list[int] = []

    def place(row: int, cols: range, prefix: tuple[int, int] = (0, 0)) -> int:
        start = len(src_row)
        src_row.extend([row] * len(cols))
        src_col.extend(cols)
        blocks.append(Block(start, len(src_row), *prefix))
        return start

    if shared is None:
        for r in range(n):
            start = place(r, range(lens[r]))
            at_row.extend([r] * lens[r]), at_col.extend(range(lens[r])), at_index.extend(range(start, start + lens[r]))
    else:
        plens = shared[0].tolist()
        groups: dict[int, list[int]] = {}
        for r, g in enumerate(shared[1].tolist()):
            groups.setdefault(g, []).append(r)
        for rows in groups.values():
            p = plens[rows[0]]
            prompt = place(rows[0], range(p))
            for r in rows:
                at_row.extend([r] * p), at_col.extend(range(p)), at_index.extend(range(prompt, prompt + p))
                if lens[r] > p:
                    start = place(r, range(p, lens[r]), (prompt, prompt + p))
                    c = lens[r] - p
                    at_row.extend([r] * c), at_col.extend(range(p, lens[r])), at_index.extend(range(start, start + c))
    dev = input_ids.device
    rows_t = torch.tensor(src_row, dtype=torch.long, device=dev)
    cols_t = torch.tensor(src_col, dtype=torch.long, device=dev)
    where = torch.full((n, length), -1, dtype=torch.long, device=dev)
    where[torch.tensor(at_row, dtype=torch.long, device=dev), torch.tensor(at_col, dtype=torch.long, device=dev)] = \
        torch.tensor(at_index, dtype=torch.long, device=dev)
    return Packed(input_ids[rows_t, cols_t].unsqueeze(0), cols_t.unsqueeze(0), PackPlan(blocks), where)


def packed_states(body: Any, packed: Packed, input_ids: torch.Tensor, target_mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decoder `body` over the packed sequence: the hidden states predicting each target token of the
    padded batch, the targets, and their flat [N * L] positions (as the padded forward returns them)."""
    length = input_ids.shape[1]
    layers = getattr(body, "layers", None)
    before = packed.plan.calls
    hidden = body(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                  **{PLAN_KEY: packed.plan}).last_hidden_state[0]
    seen = packed.plan.calls - before
    if seen == 0 or (layers is not None and seen < len(layers)):
        raise PackingUnsupported(f"{type(body).__name__}: the decoder layers do not pass attention keywords to "
                                 f"their attention ({seen} of {len(layers) if layers is not None else '?'} saw the "
                                 f"packing plan)")
    rows, cols = torch.nonzero(target_mask[:, 1:] > 0, as_tuple=True)  # the state at t predicts token t + 1
    source = packed.where[rows, cols]
    if bool((source < 0).any()):
        raise ValueError("a target token has no packed state before it (a target in the padding)")
    return hidden[source], input_ids[rows, cols + 1], rows * length + cols + 1


_UNPACKABLE: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_log = logging.getLogger("upslope")


def packed_or_none(model: Any, body: Any, layers: contextlib.AbstractContextManager[Any], input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, target_mask: torch.Tensor,
                   shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`packed_states` of the rows (each group's prompt once with `shared` = (prompt_lens, seq_lens,
    group_ids)) with the decoder `layers` wrapped as given (e.g. checkpointed), or None for a model the
    packed forward cannot run (said once per model; the caller pads)."""
    if model in _UNPACKABLE or mixers.sets_aside(model, "train.packing"):
        return None
    seq_lens = attention_mask.sum(1) if shared is None else shared[1]
    layout = pack(input_ids, seq_lens, None if shared is None else (shared[0], shared[2]))
    try:
        enable(model)
        with layers:
            return packed_states(body, layout, input_ids, target_mask)
    except PackingUnsupported as err:
        _log.warning(f"train.packing: {err}; this model runs padded micro-batches")
        _UNPACKABLE[model] = True
        return None


# ---------------------------------------------------------------- the attention implementation


def enable(model: Any) -> None:
    """Route `model`'s attention through the packing-aware implementation (idempotent). Without a plan
    in the call it is the model's own implementation, mask included, so every other forward is as before."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = getattr(model, "config", None)
    base = getattr(config, "_attn_implementation", None)
    if base is None:
        raise PackingUnsupported(f"{type(model).__name__}: no attention implementation to wrap")
    if base.startswith(_PREFIX):
        return
    if base != "eager" and base not in ALL_ATTENTION_FUNCTIONS:
        raise PackingUnsupported(f"{type(model).__name__}: attention implementation {base!r} is not one "
                                 f"transformers registers")
    name = _PREFIX + base
    if name not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(name, _wrap(base))
        if base in ALL_MASK_ATTENTION_FUNCTIONS:
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    model.set_attn_implementation(name)


def _own_attention(base: str, module: Any) -> Callable[..., Any]:
    """The implementation the model would have run: a registered one, or the eager attention of the
    attention module's own modeling file (which carries the family's details, e.g. soft-capping)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base == "eager":
        return getattr(sys.modules[type(module).__module__], "eager_attention_forward")
    return ALL_ATTENTION_FUNCTIONS[base]


def _wrap(base: str) -> Callable[..., Any]:
    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        plan = kwargs.pop(PLAN_KEY, None)
        if plan is None:
            return _own_attention(base, module)(module, query, key, value, attention_mask, **kwargs)
        plan.calls += 1
        if base == "sdpa":  # transformers' sdpa attention does not soft-cap: neither does its packed form
            kwargs.pop("softcap", None)
        return block_attention(plan, query, key, value, chunk=_chunk_of(module), **kwargs), None

    return attention


def _chunk_of(module: Any) -> int | None:
    """The attention chunk of `module`'s layer when it is a chunked-attention layer (Llama 4: the config's
    `attention_chunk_size` on the layers `layer_types` marks `chunked_attention`), else None."""
    config = getattr(module, "config", None)
    size = getattr(config, "attention_chunk_size", None)
    if not size:
        return None
    types, index = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if types is None or index is None:
        raise PackingUnsupported(f"{type(module).__name__}: chunked attention on layers the config does not name")
    return int(size) if types[index] == "chunked_attention" else None


def block_attention(plan: PackPlan, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                    dropout: float = 0.0, scaling: float | None = None, softcap: float | None = None,
                    sliding_window: int | None = None, chunk: int | None = None, **other: Any) -> torch.Tensor:
    """Attention of a packed [1, heads, T, dim] query within each block of `plan` (and within `chunk`-token
    chunks of each row when given); [1, T, heads, dim]."""
    unknown = {k: v for k, v in other.items() if v is not None and k not in _IGNORED}
    if unknown:
        raise PackingUnsupported(f"attention options the packed forward does not implement: {sorted(unknown)}")
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    outs = []
    for block in plan.blocks:
        own = slice(block.start, block.end)
        q, k, v = query[:, :, own], key[:, :, own], value[:, :, own]
        if block.prefix:
            pre = slice(block.prefix_start, block.prefix_end)
            k = torch.cat([key[:, :, pre], k], 2)
            v = torch.cat([value[:, :, pre], v], 2)
        mask = plan.mask(block, sliding_window, query.device, chunk)
        outs.append(_attend(q, k, v, mask, scale, softcap, dropout))
    return torch.cat(outs, 2).transpose(1, 2).contiguous()


# keywords the model's attention call may carry that do not change the attention itself
_IGNORED = {"position_ids", "output_attentions", "use_cache", "cache_position", "past_key_values",
            "position_embeddings", "is_causal", "layer_idx"}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
            softcap: float | None, dropout: float) -> torch.Tensor:
    if softcap is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                                is_causal=mask is None, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=dropout > 0)
    return torch.matmul(weights, v)
