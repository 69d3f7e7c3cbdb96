"""Branch rollouts: half of a group is sampled in full, and each of those completions gets a sibling that keeps
its first tokens, optionally forces a few more (not trained on), and is continued by the policy. The pair is a
two-leaf tree (meta["tree"]: the shared prefix node and the two branches), so the advantage `tree` credits the
prefix by the group's comparison and each branch by the pair's. A method is the rule that chooses where to
branch and what to force (a `Branch`): E3RL erases a segment whose cross-entropy crosses an adaptive threshold
and regenerates it; ReSum masks a self-summary phrase the policy wrote, or injects one where it wrote none."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from upslope.batch import Batch
from upslope.bounds import Count, NonNegative, PositiveCount
from upslope.data.types import Example
from upslope.engine import Completion, Engine, SamplingParams
from upslope.errors import ConfigError
from upslope.registry import ROLLOUTS
from upslope.rollout.plugin import groups_to_batch
from upslope.rollout.tree import continue_from


@dataclass(frozen=True)
class Branch:
    """Where a sibling leaves its completion: the completion's first `point` tokens are kept, `forced` tokens
    follow (given, not sampled: not trained on), then the policy continues; `kind` names the branch in metrics."""

    point: int
    forced: tuple[int, ...] = ()
    kind: str = "branch"


Chooser = Callable[[list[list[Completion]], Any, SamplingParams], list[list[Branch]]]  # (groups, tokenizer, params)


def branch_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                   params: SamplingParams, pad_id: int, group_offset: int, choose: Chooser, name: str) -> Batch:
    """rollout.n / 2 completions per prompt, each followed by its sibling from `choose`; one generate call for
    the originals and one for every sibling (vLLM's prefix cache reuses the kept prefixes)."""
    if params.n % 2:
        raise ConfigError(f"rollout.kind={name}: each sampled completion gets one sibling, so rollout.n must be "
                          f"even (got {params.n})")
    tok = engine.tokenizer  # type: ignore[attr-defined]
    groups = engine.generate(list(prompt_ids), replace(params, n=params.n // 2))
    plans = choose(groups, tok, params)
    jobs = [(g, j, c, b) for g, (comps, bs) in enumerate(zip(groups, plans)) for j, (c, b) in enumerate(zip(comps, bs))]
    for _, _, c, b in jobs:  # a sibling keeps room for one sampled token
        assert 0 <= b.point <= len(c.token_ids) and b.point + len(b.forced) < params.max_new_tokens, (name, b)
    seed = None if params.seed is None else params.seed + 1
    conts = continue_from(engine, [list(prompt_ids[g]) for g, _, _, _ in jobs],
                          [c.token_ids[:b.point] + list(b.forced) for _, _, c, b in jobs], replace(params, n=1, seed=seed))
    out: list[list[Completion]] = [[] for _ in groups]
    masks, extra = [], []
    for (g, j, c, b), [cont] in zip(jobs, conts):
        ids = c.token_ids[:b.point] + list(b.forced) + cont.token_ids
        sibling = Completion(ids, c.logprobs[:b.point] + [0.0] * len(b.forced) + cont.logprobs,
                             tok.decode(ids, skip_special_tokens=True), cont.finish_reason)
        out[g] += [c, sibling]
        masks += [[1] * len(c.token_ids), [1] * b.point + [0] * len(b.forced) + [1] * len(cont.token_ids)]
        for k in (0, 1):
            extra.append({"tree": {"nodes": [str(j), f"{j}.{k}"], "ends": [b.point]},
                          "metrics": {f"{name}/{b.kind}": 1.0, f"{name}/branch_point": float(b.point)}})
    return groups_to_batch(prompt_ids, examples, out, params, pad_id, engine.version, group_offset, extra, masks)


def segment_ce(logprobs: Sequence[float], segment_len: int) -> list[float]:
    """Mean surprisal (-log p, the sampler's local cross-entropy) of each consecutive `segment_len` tokens."""
    return [-sum(logprobs[s:s + segment_len]) / len(logprobs[s:s + segment_len])
            for s in range(0, len(logprobs), segment_len)]


def erase_points(groups: list[list[Completion]], segment_len: int, k: float) -> list[list[Branch]]:
    """E3RL's choice: the threshold is mean + k std of every segment's cross-entropy in the round (adaptive: it
    moves with the policy); a completion branches at the start of its first segment above it (erased and
    regenerated), or, with none above it, at 0 (a fresh sample)."""
    ces = [segment_ce(c.logprobs, segment_len) for comps in groups for c in comps]
    flat = [x for row in ces for x in row]
    mu = sum(flat) / max(len(flat), 1)
    sd = math.sqrt(sum((x - mu) ** 2 for x in flat) / max(len(flat) - 1, 1))
    rows = iter(ces)
    out = []
    for comps in groups:
        out.append([])
        for _ in comps:
            hot = next((s for s, x in enumerate(next(rows)) if x > mu + k * sd), None)
            out[-1].append(Branch(hot * segment_len, kind="erased") if hot is not None else Branch(0, kind="fresh"))
    return out


@ROLLOUTS.register("e3rl", train_only=True)
def e3rl_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                 params: SamplingParams, pad_id: int, group_offset: int = 0, *, segment_len: PositiveCount = 8,
                 k: NonNegative = 1.0) -> Batch:
    """E3RL: a segment whose cross-entropy crosses an adaptive threshold is erased and regenerated as a sibling.

    segment_len: tokens per segment (consecutive, fixed length)
    k: the threshold is the round's mean segment cross-entropy plus k standard deviations

    E3RL (Wang et al. 2026) grounds epistemic uncertainty in the model's local autoregressive cross-entropy,
    with segment-level adaptive thresholds, erases a defective segment and regenerates it reusing the KV
    cache, and allocates advantages per segment. Our choices: fixed-length segments, the cross-entropy is
    the sampler's mean surprisal over the segment, the threshold is mean + k std over the round's segments,
    the first segment above it is erased; the erased completion stays in the batch beside its regeneration
    (per-segment credit with advantage `tree`: the kept prefix against the group, the erased segment and
    its regeneration against each other); a completion with no segment above it gets a fresh sibling.
    """
    return branch_rollout(engine, prompt_ids, examples, params, pad_id, group_offset,
                          lambda groups, tok, p: erase_points(groups, segment_len, k), "e3rl")


def summary_points(groups: list[list[Completion]], tok: Any, params: SamplingParams, phrase: str,
                   rng: random.Random) -> list[list[Branch]]:
    """ReSum's choice: a completion whose text holds `phrase` branches just before it (the sibling is continued
    without it: masked); one without it branches at a uniformly drawn token with the phrase forced there
    (injected), within the room max_new_tokens leaves."""
    forced = tuple(tok.encode(phrase, add_special_tokens=False))
    out = []
    for comps in groups:
        out.append([])
        for c in comps:
            at = c.text.find(phrase.strip())
            if at >= 0:
                point = max(k for k in range(len(c.token_ids) + 1)
                            if len(tok.decode(c.token_ids[:k], skip_special_tokens=True)) <= at)
                out[-1].append(Branch(point, kind="masked"))
            else:
                top = min(len(c.token_ids), params.max_new_tokens - len(forced) - 1)
                if top < 0:
                    raise ConfigError(f"rollout.options.phrase: {len(forced)} tokens leave no room in "
                                      f"rollout.max_new_tokens={params.max_new_tokens}")
                out[-1].append(Branch(rng.randint(0, top), forced, kind="injected"))
    return out


@ROLLOUTS.register("resum", train_only=True)
def resum_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                  params: SamplingParams, pad_id: int, group_offset: int = 0, *, phrase: str = " In summary,",
                  seed: Count = 0) -> Batch:
    """ReSum: contrastive siblings with a self-summary phrase masked where the policy wrote one, injected where not.

    phrase: the summarisation phrase (searched in the text, forced as its tokens)
    seed: seeds the injection points with the round's sampling seed (unseeded when sampling is)

    ReSum (Wang et al. 2026) masks the summarisation phrase where the model triggered one, injects it at a
    random non-summarisation position otherwise, and compares the two branches with a summarisation-aware
    advantage. Our choices: a masked sibling is regenerated from just before the phrase (the policy may
    write it again: the metric resum/masked counts the branches, not the re-summaries); injection points are
    uniform over the completion's tokens; the summarisation-aware advantage is advantage `tree` over the
    pair (the prefix credited against the group, the branch with and the branch without the summary against
    each other), so a summary is credited by exactly what it changed.
    """
    rng = random.Random(None if params.seed is None else seed * 1_000_003 + params.seed)
    return branch_rollout(engine, prompt_ids, examples, params, pad_id, group_offset,
                          lambda groups, tok, p: summary_points(groups, tok, p, phrase, rng), "resum")
