"""Tree rollouts: TreeRPO's branching of partial trajectories, and CATPO's healing of
all-fail trees by a critique. Only the plain `Engine.generate` is used (prompt + forced prefix as the
prompt, as DenoiseRL does), so the HF engine and vLLM both serve it and vLLM's prefix cache reuses the
shared prefixes; each row is one leaf, its path through the tree in meta["tree"] (read by advantage `tree`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Literal, Sequence

from pydantic import Field

from upslope.agents.socratic import CRITIQUES
from upslope.algos.tree import segments
from upslope.batch import Batch
from upslope.bounds import Count
from upslope.data.types import Example
from upslope.engine import Completion, Engine, SamplingParams
from upslope.errors import ConfigError
from upslope.registry import ROLLOUTS
from upslope.rollout.plugin import groups_to_batch


@dataclass
class Leaf:
    """A root-to-leaf path: tokens and sampler log-probs, the nodes it passes (`nodes[j]` ends at `ends[j]`,
    the last runs to the end), how many of its tokens were sampled for it (not copied from a prefix), and
    whether it is a graft (CATPO healing)."""

    tokens: list[int]
    logprobs: list[float]
    finish: str
    nodes: list[str]
    ends: list[int]
    sampled: int
    graft: bool = False


def branch_point(leaf: Leaf, depth: int, points: str) -> int:
    """Where the leaf's deepest node branches: at token `depth` (fixed) or before its most surprising sampled
    token after the parent's branch point (entropy: the sampler's surprisal stands in for the entropy), kept
    within [the parent's branch point, the last token] so every continuation has room."""
    lo, hi = (leaf.ends[-1] if leaf.ends else 0), len(leaf.tokens) - 1
    if points == "entropy":
        depth = max(range(min(lo + bool(leaf.ends), hi), hi + 1), key=lambda t: -leaf.logprobs[t])
    return min(max(depth, lo), hi)


def continue_from(engine: Engine, prompts: list[list[int]], prefixes: list[list[int]],
                  params: SamplingParams) -> list[list[Completion]]:
    """params.n continuations of each prompt + prefix in one generate call, each cut to the room its prefix
    leaves of max_new_tokens (sampling to a shorter limit draws the same tokens)."""
    budget = params.max_new_tokens - min(len(p) for p in prefixes)
    outs = engine.generate([p + x for p, x in zip(prompts, prefixes)], replace(params, max_new_tokens=budget))
    room = [params.max_new_tokens - len(x) for x in prefixes]
    return [[c if len(c.token_ids) <= r else Completion(c.token_ids[:r], c.logprobs[:r], "", "length") for c in comps]
            for comps, r in zip(outs, room)]


def heal(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example], trees: list[list[Leaf]],
         params: SamplingParams, count: int, critique: str) -> None:
    """CATPO's healing: in a tree whose every leaf the critique finds wrong, `count` leaves (spread over the
    tree) are regrown from their shallowest failure point with the critique in the context, and the
    continuations are grafted on as new leaves, children of the deepest node before that point."""
    tok, critic, jobs = engine.tokenizer, CRITIQUES[critique], []  # type: ignore[attr-defined]
    for g, tree in enumerate(trees):
        notes = [critic(examples[g], leaf.tokens, lambda t: tok.decode(t, skip_special_tokens=True)) for leaf in tree]
        if all(notes):
            picks = [h * len(tree) // count for h in range(count)]
            jobs += [(g, tree[i], *notes[i]) for i in picks]  # type: ignore[misc]
    if not jobs:
        return
    hints = [list(prompt_ids[g]) + tok.encode(" " + text, add_special_tokens=False) for g, _, _, text in jobs]
    grafts = continue_from(engine, hints, [leaf.tokens[:fp] for _, leaf, fp, _ in jobs], replace(params, n=1))
    for h, ((g, leaf, fp, _), [c]) in enumerate(zip(jobs, grafts)):
        keep = sum(e <= fp for e in leaf.ends)
        name = f"{leaf.nodes[keep - 1]}.h{h}" if keep else f"h{h}"
        trees[g].append(Leaf(leaf.tokens[:fp] + c.token_ids, leaf.logprobs[:fp] + c.logprobs, c.finish_reason,
                             leaf.nodes[:keep] + [name], leaf.ends[:keep], len(c.token_ids), graft=True))


def once_masks(trees: list[list[Leaf]]) -> list[list[int]]:
    """Loss masks that train each node's segment in the first leaf under it only (shared_prefix: once)."""
    masks = []
    for tree in trees:
        seen: set[str] = set()
        for leaf in tree:
            m = [1] * len(leaf.tokens)
            for name, (s, e) in zip(leaf.nodes, segments(leaf.ends, len(leaf.tokens))):
                m[s:e] = [0] * (e - s) if name in seen else m[s:e]
                seen.add(name)
            masks.append(m)
    return masks


@ROLLOUTS.register("tree", train_only=True)
def tree_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example], params: SamplingParams,
                 pad_id: int, group_offset: int = 0, *, branches: Annotated[int, Field(ge=2)] = 2,
                 depths: list[int] = [1, 2],  # noqa: B006
                 points: Literal["fixed", "entropy"] = "fixed",
                 shared_prefix: Literal["every_leaf", "once"] = "every_leaf", heal_leaves: Count = 0,
                 critique: Literal["arith"] = "arith") -> Batch:
    """TreeRPO / CATPO tree rollout: rollout.n leaves per prompt that share prefixes, by branching partial trajectories.

    branches: children of every node at a branch point (>= 2)
    depths: one branch point per level: its token depth (points: fixed); with entropy only their count is used
    points: `fixed` (branch at the token depths) or `entropy` (before the most surprising sampled token)
    shared_prefix: `every_leaf` (each leaf row trains its whole path) or `once` (a node's tokens in one row only)
    heal_leaves: CATPO: leaves grafted onto an all-fail tree from the critique (0: no healing, TreeRPO)
    critique: the critique that judges leaves and guides the grafts (`arith`: a rule on the arith task)

    rollout.n / branches**len(depths) paths are sampled in full; at each branch point every path keeps its own
    continuation as its first child and gets branches - 1 fresh ones from its prefix (one generate call per
    level). `every_leaf` is the default because a leaf row is one trajectory sample: a node's segment then counts
    once per leaf under it, as in GRPO over the leaves (the unbiased leaf-weighted gradient); `once` weights
    every node alike. The critique is a rule (the SocraticPO teacher, the paper's is an LLM); graft tokens were
    sampled with it in the context, which the trained row does not show (the graft is off-policy).
    """
    width = branches ** len(depths)
    if branches < 2 or params.n % width:
        raise ConfigError(f"rollout.options: a tree with branches={branches} at {len(depths)} branch points has "
                          f"{width} leaves per path; rollout.n={params.n} must be a multiple of it (branches >= 2)")

    def seed(k: int) -> int | None:  # each generate call of the tree its own seed
        return None if params.seed is None else params.seed + k

    trees = [[Leaf(c.token_ids, c.logprobs, c.finish_reason, [str(j)], [], len(c.token_ids)) for j, c in enumerate(cs)]
             for cs in engine.generate(list(prompt_ids), replace(params, n=params.n // width))]
    for level, depth in enumerate(depths, 1):
        where = [(g, leaf, branch_point(leaf, depth, points)) for g, tree in enumerate(trees) for leaf in tree]
        conts = continue_from(engine, [list(prompt_ids[g]) for g, _, _ in where], [x.tokens[:b] for _, x, b in where],
                              replace(params, n=branches - 1, seed=seed(level)))
        trees = [[] for _ in trees]
        for (g, x, b), comps in zip(where, conts):
            trees[g].append(replace(x, nodes=x.nodes + [f"{x.nodes[-1]}.0"], ends=x.ends + [b]))
            trees[g] += [Leaf(x.tokens[:b] + c.token_ids, x.logprobs[:b] + c.logprobs, c.finish_reason,
                              x.nodes + [f"{x.nodes[-1]}.{k}"], x.ends + [b], len(c.token_ids))
                         for k, c in enumerate(comps, 1)]
    if heal_leaves:
        heal(engine, prompt_ids, examples, trees, replace(params, seed=seed(len(depths) + 1)), heal_leaves, critique)
    decode = engine.tokenizer.decode  # type: ignore[attr-defined]
    groups = [[Completion(x.tokens, x.logprobs, decode(x.tokens, skip_special_tokens=True), x.finish) for x in t]
              for t in trees]
    extra = [{"tree": {"nodes": x.nodes, "ends": x.ends},
              "metrics": {"tree/graft": float(x.graft),
                          "tree/sampled_tokens": float(x.sampled)}} for t in trees for x in t]
    return groups_to_batch(prompt_ids, examples, groups, params, pad_id, engine.version, group_offset, extra,
                           once_masks(trees) if shared_prefix == "once" else None)
