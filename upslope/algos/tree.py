"""Tree credit: TreeRPO's per-segment advantage over a tree rollout's nodes, and
CATPO's per-tree informativeness weight. The tree comes from the `tree` rollout: each row's
meta["tree"] names the nodes its completion passes through (root first) and where each node's segment
ends; a row without one is a leaf directly under its group's prompt (then `tree` is GRPO).
No `from __future__ import annotations`: the registry validates options against real annotations.
"""
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import NonNegative
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def segments(ends: list[int], length: int) -> list[tuple[int, int]]:
    """(start, end) completion positions of each node on a leaf's path: node j spans the previous
    branch point (0 for the first) to its own, and the leaf's own node runs to the end."""
    cuts = [0, *ends, length]
    return list(zip(cuts[:-1], cuts[1:]))


def node_paths(batch: Batch) -> list[list[tuple[tuple[int, str], int, int]]]:
    """Per row: (node key, start, end) of every node on its path; keys are (group id, node name)."""
    out = []
    for i, m in enumerate(batch.meta):
        tree: dict[str, Any] = m.get("tree") or {"nodes": [f"row{i}"], "ends": []}
        g, length = int(batch.group_ids[i]), int(batch.completion_lens[i])
        spans = segments(list(tree["ends"]), length)
        out.append([((g, name), s, e) for name, (s, e) in zip(tree["nodes"], spans)])
    return out


@dataclass(frozen=True)
class TreeNode:
    """A node of a tree rollout: its group and name, the first row through it, its segment's completion
    positions [start, end), its value (the mean reward of the rows through it) and its parent (an index into
    the nodes; -1 for a node right under the prompt)."""

    group: int
    name: str
    row: int
    start: int
    end: int
    value: float
    parent: int


def tree_nodes(batch: Batch, rewards: Tensor) -> list[TreeNode]:
    """Every node of the batch's trees, in order of first appearance (a row without a tree is a leaf under its
    prompt)."""
    first: dict[tuple[int, str], tuple[int, int, int]] = {}
    total: dict[tuple[int, str], float] = {}
    count: dict[tuple[int, str], int] = {}
    parent: dict[tuple[int, str], tuple[int, str] | None] = {}
    for i, path in enumerate(node_paths(batch)):
        for j, (key, s, e) in enumerate(path):
            first.setdefault(key, (i, s, e))
            total[key] = total.get(key, 0.0) + float(rewards[i])
            count[key] = count.get(key, 0) + 1
            parent[key] = path[j - 1][0] if j else None
    index = {k: n for n, k in enumerate(first)}
    return [TreeNode(*k, *first[k], total[k] / count[k], -1 if (p := parent[k]) is None else index[p]) for k in first]


def sibling_sets(nodes: list[TreeNode]) -> list[list[int]]:
    """Indices of the nodes that share a parent (the children of one node, or of one prompt)."""
    out: dict[tuple[int, int], list[int]] = {}
    for n, node in enumerate(nodes):
        out.setdefault((node.group, node.parent), []).append(n)
    return list(out.values())


def segment_advantages(batch: Batch, rewards: Tensor, *, scale_by_std: bool, eps: float) -> Tensor:
    """TreeRPO's credit: a node's value is the mean reward of the leaves under it, and each segment gets
    its node's value normalised among its siblings (the nodes branching from the same parent), i.e. the
    value difference across the branch point, / the siblings' std; exactly 0 where siblings tie."""
    paths = node_paths(batch)
    nodes = tree_nodes(batch, rewards)
    siblings = torch.empty(len(nodes), dtype=torch.long)
    for k, kids in enumerate(sibling_sets(nodes)):
        siblings[kids] = k
    values = torch.tensor([n.value for n in nodes], dtype=torch.float64)
    adv = group_normalize(values, siblings, scale_by_std=scale_by_std, eps=eps)
    node_adv = {(n.group, n.name): a for n, a in zip(nodes, adv.tolist())}
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    for i, path in enumerate(paths):
        p = int(batch.prompt_lens[i])
        for key, s, e in path:
            out[i, p + s:p + e] = node_adv[key]
    return out


def tree_informativeness(batch: Batch, rewards: Tensor, kind: str) -> Tensor:
    """CATPO's F(T) per row (of its tree): leaf-outcome diversity 4p(1 - p) (p: share of leaves with reward
    >= 0.5), times 1 - |corr(leaf confidence, reward)| with `outcome_decorrelation` (a tree whose outcomes the
    policy's own confidence, the mean sampler log-prob of the leaf, already predicts teaches little)."""
    length = batch.input_ids.shape[1]
    pos = torch.arange(length)[None, :]
    gen = ((pos >= batch.prompt_lens[:, None]) & (pos < batch.seq_lens[:, None])).to(torch.float64)
    conf = (batch.sampler_logprobs.to(torch.float64) * gen).sum(1) / gen.sum(1).clamp(min=1)
    out = torch.zeros(batch.size, dtype=torch.float64)
    for g in batch.group_ids.unique():
        rows = batch.group_ids == g
        r, c = rewards[rows], conf[rows]
        p = float((r >= 0.5).double().mean())
        score = 4 * p * (1 - p)
        if kind == "outcome_decorrelation" and r.numel() > 1:
            dr, dc = r - r.mean(), c - c.mean()
            den = float((dr.square().sum() * dc.square().sum()).sqrt())
            score *= 1 - (abs(float((dr * dc).sum())) / den if den > 0 else 0.0)
        out[rows] = score
    return out


@ADVANTAGES.register("tree", grouped=True)
def tree_advantage(batch: Batch, *, credit: Literal["segment", "leaf"] = "segment", scale_by_std: bool = True,
                   eps: NonNegative = 1e-6, informativeness: Literal["none", "outcome",
                   "outcome_decorrelation"] = "none",
                   min_informativeness: float = 0.0) -> Tensor:
    """TreeRPO / CATPO: advantages over a tree rollout's segments (rollout `tree`), optionally weighted per tree.

    credit: `segment` (TreeRPO: node value minus its siblings' mean) or `leaf` (GRPO over the leaves)
    scale_by_std: divide by the siblings' (leaf: the group's) std
    eps: added to that std before dividing
    informativeness: CATPO's tree weight: `none`, `outcome` (4p(1-p)), `outcome_decorrelation` (x 1 - |corr|)
    min_informativeness: trees whose informativeness is below this get weight 0 (filtered)

    `segment` credits each segment by the value difference across its branch point; `leaf` is the simpler
    choice, every token of a leaf gets the leaf's own GRPO advantage (the tree then only shapes sampling).
    A node's value is the mean leaf reward under it; siblings' values are centred on their own mean (in a
    balanced tree that is the parent's value), so a grafted leaf (CATPO healing) is compared with the branches
    it was grafted beside. A leaf's weight is its tree's F(T) / the mean F over the leaves of the trees that keep
    a weight, so a trained leaf's weight averages 1: the gradient keeps its scale and moves toward informative trees.
    """
    if batch.rewards is None:
        raise ConfigError("advantage 'tree' needs batch.rewards (score the batch first)")
    rewards = batch.rewards.to(torch.float64)
    if credit == "leaf":
        per_sample = group_normalize(rewards, batch.group_ids, scale_by_std=scale_by_std, eps=eps)
        adv = broadcast_to_tokens(per_sample, batch.loss_mask).to(torch.float64)
    else:
        adv = segment_advantages(batch, rewards, scale_by_std=scale_by_std, eps=eps)
    if informativeness != "none":
        f = tree_informativeness(batch, rewards, informativeness)
        f = torch.where(f >= min_informativeness, f, torch.zeros_like(f))
        kept = f[f > 0]
        adv = adv * (f / kept.mean() if kept.numel() else f)[:, None]
    return (adv * (batch.loss_mask > 0)).float()
