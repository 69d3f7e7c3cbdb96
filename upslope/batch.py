"""The one batch structure that flows through every stage, and its pad/split helpers.

Layout: one row per sample, `prompt + completion` token ids, right-padded to a common
length L. Every per-token field is `[N, L]` and aligned to the token it describes: the
value at `[i, t]` is about token `input_ids[i, t]` (for log-probs: log p(token t | tokens
< t)). `loss_mask` is 1 exactly on the tokens the policy is trained on (completion
tokens the model generated), 0 on prompt, padding and environment/tool tokens.
A MoE model's batch may also carry the experts the sampler routed each token to (`routed_experts`,
prompt tokens included), which the learner replays.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterator, Sequence

import torch

_TOKEN_FIELDS = ("input_ids", "attention_mask", "loss_mask", "sampler_logprobs", "advantages", "old_logprobs",
                 "ref_logprobs", "values", "returns", "token_rewards", "teacher_logprobs", "teacher_topk_ids",
                 "teacher_topk_logprobs", "advantage_bonus", "routed_experts")
_SAMPLE_FIELDS = ("prompt_lens", "seq_lens", "group_ids", "rewards", "truncated", "policy_version", "reward_scale",
                  "reward_override")


@dataclass
class Batch:
    """Samples of one step. Optional fields are filled by the stage that needs them."""

    input_ids: torch.Tensor  # [N, L] long, right-padded with pad_id
    attention_mask: torch.Tensor  # [N, L] bool, True on real tokens
    loss_mask: torch.Tensor  # [N, L] float, 1 on trained tokens
    prompt_lens: torch.Tensor  # [N] long
    seq_lens: torch.Tensor  # [N] long, prompt + completion length
    group_ids: torch.Tensor  # [N] long, which prompt a sample came from
    sampler_logprobs: torch.Tensor  # [N, L] float, the engine's log-prob of each generated token
    truncated: torch.Tensor  # [N] bool, completion hit max_new_tokens
    policy_version: torch.Tensor  # [N] long, weights version that sampled it
    rewards: torch.Tensor | None = None  # [N] combined reward
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N]
    advantages: torch.Tensor | None = None  # [N, L]
    old_logprobs: torch.Tensor | None = None  # [N, L], learner log-probs before the update
    ref_logprobs: torch.Tensor | None = None  # [N, L], frozen reference
    values: torch.Tensor | None = None  # [N, L], critic values
    returns: torch.Tensor | None = None  # [N, L], critic targets
    token_rewards: torch.Tensor | None = None  # [N, L], per-token rewards (KL in reward, shaping)
    teacher_logprobs: torch.Tensor | None = None  # [N, L], distillation teacher's log-prob of each token
    teacher_topk_ids: torch.Tensor | None = None  # [N, L, K], the teacher's K most likely tokens at each position
    teacher_topk_logprobs: torch.Tensor | None = None  # [N, L, K], ... and their teacher log-probs
    # what a rollout asks of the later stages for its samples (None: nothing asked)
    reward_scale: torch.Tensor | None = None  # [N] multiplies the combined reward (e.g. a decay after guidance)
    reward_override: torch.Tensor | None = None  # [N] replaces the combined reward where not NaN (ESPO's stop)
    advantage_bonus: torch.Tensor | None = None  # [N, L] added to the advantage (the agent's interleaved SFT term)
    # [N, L, R, K] int16: the K experts the sampler routed each token to at each of the model's R MoE layers
    # (-1: none recorded: padding, a completion's last token); set by algo.routing_replay, replayed by the learner
    routed_experts: torch.Tensor | None = None
    meta: list[dict[str, Any]] = field(default_factory=list)  # per-sample: answer, task fields, text

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_lens(self) -> torch.Tensor:
        return self.seq_lens - self.prompt_lens

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.unique().numel())

    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def select(self, index: Sequence[int] | torch.Tensor) -> "Batch":
        """The samples at `index` (in that order), trimmed to their longest row."""
        idx = torch.as_tensor(index, dtype=torch.long)
        width = int(self.seq_lens[idx].max().item()) if idx.numel() else 0
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _TOKEN_FIELDS and v is not None:
                out[f.name] = v[idx, :width]
            elif f.name in _SAMPLE_FIELDS and v is not None:
                out[f.name] = v[idx]
            elif f.name == "reward_components":
                out[f.name] = {k: t[idx] for k, t in v.items()}
            elif f.name == "meta":
                out[f.name] = [v[i] for i in idx.tolist()] if v else []
        return replace(self, **out)

    def micro_batches(self, max_tokens: int) -> Iterator["Batch"]:
        """Split into micro-batches whose padded size (rows x longest row) stays within
        `max_tokens`. Rows are sorted by length first so little compute goes to padding."""
        for idx in micro_batch_indices(self.seq_lens, max_tokens):
            yield self.select(idx)

    def to(self, device: torch.device | str) -> "Batch":
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v.to(device)
            elif f.name == "reward_components":
                out[f.name] = {k: t.to(device) for k, t in v.items()}
        return replace(self, **out)


def micro_batch_indices(seq_lens: torch.Tensor, max_tokens: int, packed: bool = False) -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted longest first, taken greedily so that
    rows x longest row <= max_tokens; `packed`: each row into the first micro-batch whose own
    tokens stay <= max_tokens (first fit, longest first). A single longer row still gets its own
    micro-batch."""
    order = torch.argsort(seq_lens, descending=True, stable=True).tolist()
    lens = seq_lens.tolist()
    chunks: list[list[int]] = []
    if packed:
        used: list[int] = []
        for i in order:
            fit = next((c for c, u in enumerate(used) if u + lens[i] <= max_tokens), None)
            if fit is None:
                chunks.append([])
                used.append(0)
                fit = len(chunks) - 1
            chunks[fit].append(i)
            used[fit] += lens[i]
        return chunks
    start = 0
    while start < len(order):
        longest = int(lens[order[start]])
        rows = max(1, max_tokens // max(longest, 1))
        chunks.append(order[start:start + rows])
        start += rows
    return chunks


def group_micro_batch_indices(prompt_lens: torch.Tensor, seq_lens: torch.Tensor, group_ids: torch.Tensor,
                              max_tokens: int, split_oversized: bool = True, packed: bool = False) -> list[list[int]]:
    """Micro-batches of whole groups for the shared-prompt forward, whose cost
    (groups x longest prompt + rows x longest completion; `packed`: each group's prompt once plus
    every completion's own tokens) stays within `max_tokens`; a group too large for the budget is
    split into parts (or, without `split_oversized`, gets a micro-batch of its own). With
    prompt_lens 0 the cost is rows x longest row, that of the plain forward."""
    comp = (seq_lens - prompt_lens).tolist()
    groups = sorted(group_ids.unique().tolist(), key=lambda g: -int(seq_lens[group_ids == g].max()))
    chunks: list[list[int]] = []
    cur: list[int] = []
    cur_groups, pmax, cmax, psum, csum = 0, 0, 0, 0, 0

    def cost(ng: int, rows: int, p: int, c: int, ps: int, cs: int) -> int:
        return ps + cs if packed else ng * p + rows * c

    for g in groups:
        rows = torch.nonzero(group_ids == g).flatten().tolist()
        gp, gc, gs = int(prompt_lens[rows[0]]), max(comp[r] for r in rows), sum(comp[r] for r in rows)
        if cur and cost(cur_groups + 1, len(cur) + len(rows), max(pmax, gp), max(cmax, gc), psum + gp,
                        csum + gs) > max_tokens:
            chunks.append(cur)
            cur, cur_groups, pmax, cmax, psum, csum = [], 0, 0, 0, 0, 0
        if split_oversized and cost(1, len(rows), gp, gc, gp, gs) > max_tokens:  # split an oversized group
            chunks += _split_group(rows, comp, gp, max_tokens, packed)
            continue
        cur += rows
        cur_groups += 1
        pmax, cmax, psum, csum = max(pmax, gp), max(cmax, gc), psum + gp, csum + gs
    if cur:
        chunks.append(cur)
    return chunks


def _split_group(rows: list[int], comp: list[int], prompt: int, max_tokens: int, packed: bool) -> list[list[int]]:
    """A group too large for one micro-batch, in parts that each fit (a part holds at least one row)."""
    if not packed:
        per = max(1, (max_tokens - prompt) // max(max(comp[r] for r in rows), 1))
        return [rows[s:s + per] for s in range(0, len(rows), per)]
    parts: list[list[int]] = [[]]
    used = prompt
    for r in rows:
        if parts[-1] and used + comp[r] > max_tokens:
            parts.append([])
            used = prompt
        parts[-1].append(r)
        used += comp[r]
    return parts


def concat(batches: Sequence[Batch], pad_id: int) -> Batch:
    """Join batches (e.g. from several rollout rounds of dynamic sampling); group ids are kept."""
    if len(batches) == 1:
        return batches[0]
    width = max(b.input_ids.shape[1] for b in batches)
    out: dict[str, Any] = {}
    for f in fields(Batch):
        vals = [getattr(b, f.name) for b in batches]
        if f.name in _TOKEN_FIELDS:
            if any(v is None for v in vals):
                out[f.name] = None
                continue
            fill = PAD_FILL.get(f.name, 0) if f.name != "input_ids" else pad_id
            out[f.name] = torch.cat([_pad_right(v, width, fill) for v in vals])
        elif f.name in _SAMPLE_FIELDS:
            out[f.name] = None if any(v is None for v in vals) else torch.cat(vals)
        elif f.name == "reward_components":
            keys = vals[0].keys()
            out[f.name] = {k: torch.cat([v[k] for v in vals]) for k in keys}
        elif f.name == "meta":
            out[f.name] = [m for v in vals for m in v]
    return Batch(**out)


def in_group_order(parts: Sequence[Batch], pad_id: int) -> Batch:
    """Pieces of whole groups (disjoint runs of group ids, e.g. a rollout round's jobs) joined in
    order of their first group id, as one rollout of them all would have returned them."""
    return concat(sorted(parts, key=lambda b: int(b.group_ids[0]) if b.size else -1), pad_id)


PAD_FILL = {"routed_experts": -1}  # what pads a token field beyond its rows' ends (else 0; input_ids: pad_id)


def _pad_right(t: torch.Tensor, width: int, value: float | int) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    pad = torch.full((t.shape[0], width - t.shape[1], *t.shape[2:]), value, dtype=t.dtype)
    return torch.cat([t, pad], dim=1)


def build_batch(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    completion_logprobs: Sequence[Sequence[float]],
    group_ids: Sequence[int],
    truncated: Sequence[bool],
    pad_id: int,
    policy_version: int = 0,
    meta: Sequence[dict[str, Any]] | None = None,
    completion_loss_masks: Sequence[Sequence[int]] | None = None,
    routed_experts: Sequence[torch.Tensor | None] | None = None,
) -> Batch:
    """Pad per-sample token lists into a Batch. `completion_loss_masks` (optional) marks
    completion tokens not to train on, e.g. tool output in a multi-turn rollout. `routed_experts`
    (optional) are each sample's recorded experts, [prompt + completion tokens, R, K]; the batch
    carries them only when every sample has them."""
    n = len(prompt_ids)
    lens = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max(lens) if lens else 0
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.bool)
    loss = torch.zeros((n, width), dtype=torch.float32)
    lps = torch.zeros((n, width), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        lp, lc = len(p), len(c)
        ids[i, :lp] = torch.as_tensor(list(p), dtype=torch.long)
        if lc:
            ids[i, lp:lp + lc] = torch.as_tensor(list(c), dtype=torch.long)
            lps[i, lp:lp + lc] = torch.as_tensor(list(completion_logprobs[i]), dtype=torch.float32)
            m = completion_loss_masks[i] if completion_loss_masks is not None else [1] * lc
            loss[i, lp:lp + lc] = torch.as_tensor(list(m), dtype=torch.float32)
        attn[i, :lp + lc] = True
    routed = None
    if routed_experts is not None and n and all(r is not None for r in routed_experts):
        first = routed_experts[0]
        assert first is not None
        routed = torch.full((n, width, *first.shape[1:]), PAD_FILL["routed_experts"], dtype=first.dtype)
        for i, r in enumerate(routed_experts):
            assert r is not None and r.shape[0] == lens[i], "routed experts: one row per prompt and completion token"
            routed[i, :lens[i]] = r
    return Batch(
        routed_experts=routed,
        input_ids=ids,
        attention_mask=attn,
        loss_mask=loss,
        prompt_lens=torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
        seq_lens=torch.tensor(lens, dtype=torch.long),
        group_ids=torch.as_tensor(list(group_ids), dtype=torch.long),
        sampler_logprobs=lps,
        truncated=torch.as_tensor(list(truncated), dtype=torch.bool),
        policy_version=torch.full((n,), policy_version, dtype=torch.long),
        meta=list(meta) if meta is not None else [{} for _ in range(n)],
    )
