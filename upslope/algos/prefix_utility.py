"""PUM (*From Correctness to Utility: Gain-Based Prefix Evaluation for LLM Reasoning*, 2026): a prefix utility
model, trained by pairwise ranking on measured solve rates of prefixes, scores every prefix, and the utility
each token adds is a dense reward. The measurements come from a tree rollout (rollout `tree`): a node's solve
rate is the mean reward of the leaves under it (upslope.algos.tree). Registered with
`features="hidden_states"`: the policy's last-layer hidden state at every position (the prefix's features)."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import per_position_inputs, broadcast_to_tokens, group_normalize
from upslope.algos.tree import TreeNode, sibling_sets, tree_nodes
from upslope.batch import Batch
from upslope.bounds import NonNegative, Positive, PositiveCount
from upslope.registry import ADVANTAGES


def ranked_pairs(nodes: list[TreeNode]) -> list[tuple[int, int]]:
    """(better, worse) of every two siblings (nodes with one parent) whose solve rates differ: between siblings
    the solve-rate gain over the parent orders them as the solve rate does."""
    return [(a, b) for kids in sibling_sets(nodes) for a in kids for b in kids if nodes[a].value > nodes[b].value]


def fit_ranker(better: Tensor, worse: Tensor, l2: float, iters: int) -> Tensor:
    """[D] weights w minimising sum log(1 + exp(-(better - worse) . w)) + l2 / 2 |w|^2 (Bradley-Terry ranking
    of the pairs' features [P, D]) by Newton's method from 0."""
    x = (better - worse).to(torch.float64)
    w = torch.zeros(x.shape[1], dtype=torch.float64)
    eye = torch.eye(x.shape[1], dtype=torch.float64)
    for _ in range(iters):
        p = torch.sigmoid(-(x @ w))  # each pair's probability of being misordered
        grad = -(x * p[:, None]).sum(0) + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + l2 * eye
        w = w - torch.linalg.solve(hess, grad)
    return w


def utility_gains(states: Tensor, mask: Tensor, w: Tensor) -> Tensor:
    """[N, L]: at each trained token t, u(prefix through t) - u(prefix before t), u(h) = h . w; 0 elsewhere."""
    u = states.to(torch.float64) @ w
    before = torch.cat([torch.zeros_like(u[:, :1]), u[:, :-1]], dim=1)
    return (u - before) * (mask > 0)


@ADVANTAGES.register("pum", grouped=True, whole_batch=True, features="hidden_states")
def pum(batch: Batch, features: Tensor | None = None, *, coef: NonNegative = 0.5, l2: Positive = 1.0,
        iters: PositiveCount = 20, scale_by_std: bool = True, eps: NonNegative = 1e-6) -> Tensor:
    """PUM: GRPO on the outcome plus, on each token, the prefix utility it adds under a linear utility head
    fitted to the batch's measured prefix solve rates by pairwise ranking.

    coef: weight of the dense part (each token's utility gain, divided by the batch's RMS gain)
    l2: ridge penalty of the utility head (on the scale of the hidden states' squared norms)
    iters: Newton steps of the ranking fit
    scale_by_std: divide the outcome part by the group's reward std (as GRPO)
    eps: added to that std before dividing

    PUM (2026) measures a prefix's gain as the solve-rate improvement of completions conditioned on it, and
    trains a prefix utility model on it with a pairwise ranking objective; the model scores partial and
    complete trajectories and gives dense rewards. Here (CPU-sized) the model is a linear head on the
    policy's last-layer hidden state at a prefix's last token, fitted afresh on each batch (no state across
    steps) by Bradley-Terry ranking with a ridge penalty over the sibling prefixes of the batch's tree rollouts
    (rollout `tree`) whose solve rates differ; the dense reward of token t is u(prefix through t) -
    u(prefix before t), standardised by its RMS over the batch's trained tokens: our choices. Without a tree
    (no two measured siblings differ) the head is 0 and this is GRPO.
    """
    r = per_position_inputs("pum", batch, features)
    outcome = broadcast_to_tokens(group_normalize(r, batch.group_ids, scale_by_std=scale_by_std, eps=eps),
                                  batch.loss_mask).to(torch.float64)
    nodes = tree_nodes(batch, r)
    pairs = ranked_pairs(nodes)
    if not pairs:
        return outcome.float()
    # a measured prefix's features: the hidden state at its last token
    h = torch.stack([features[n.row, int(batch.prompt_lens[n.row]) + n.end - 1] for n in nodes]).to(torch.float64)
    w = fit_ranker(h[[a for a, _ in pairs]], h[[b for _, b in pairs]], l2, iters)
    gains = utility_gains(features, batch.loss_mask, w)
    on = batch.loss_mask > 0
    rms = float(gains[on].square().mean().sqrt()) if bool(on.any()) else 0.0
    dense = gains / rms if rms > 0 else gains
    return (outcome + coef * dense * on).float()
