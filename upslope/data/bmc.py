"""BMC (Bayesian Manifold Curriculum): a Bayesian bandit over a task tree built from the prompts' latent
representations picks each step's problems. Registered with `features="hidden_mean"`: at set-up the
trainer gives it each training prompt's mean last-layer hidden state from the policy."""
from __future__ import annotations

import random
from typing import Any

import torch

from upslope.bounds import Positive, PositiveCount
from upslope.errors import ConfigError
from upslope.data.samplers import OutcomeSampler
from upslope.registry import SAMPLERS


def kmeans(x: torch.Tensor, k: int, seed: int, iters: int = 20) -> torch.Tensor:
    """[M] cluster index in [0, min(k, M)) of each row of x: Lloyd's iterations from k distinct rows picked
    by a seeded permutation; a cluster left empty keeps its centre."""
    k = min(k, len(x))
    x = x.to(torch.float64)
    centres = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:k]].clone()
    labels = torch.zeros(len(x), dtype=torch.long)
    for _ in range(iters):
        labels = torch.cdist(x, centres).argmin(1)
        for c in range(k):
            members = x[labels == c]
            if len(members):
                centres[c] = members.mean(0)
    return labels


def task_tree(features: torch.Tensor, branches: int, depth: int, seed: int) -> torch.Tensor:
    """[P, depth] node of each prompt at each level: level 0 splits all prompts into `branches` clusters,
    each further level splits every node's prompts again; node ids are unique within a level."""
    paths = torch.zeros(len(features), depth, dtype=torch.long)
    groups = [torch.arange(len(features))]
    for level in range(depth):
        nxt = []
        for node_rows in groups:
            labels = kmeans(features[node_rows], branches, seed + level)
            for c in range(int(labels.max()) + 1 if len(labels) else 0):
                rows = node_rows[labels == c]
                if len(rows):
                    paths[rows, level] = len(nxt)
                    nxt.append(rows)
        groups = nxt
    return paths


@SAMPLERS.register("bmc", features="hidden_mean")
class ManifoldBandit(OutcomeSampler):
    """BMC: Thompson sampling down a task tree of the prompts' hidden states, toward the most productive nodes.

    threshold: a sample succeeds when its reward is at least this
    branches: children of each node of the tree (k-means on the prompts' hidden states)
    depth: levels of the tree (the last level's nodes are the leaves)
    prior_alpha: Beta prior successes of every node
    prior_beta: Beta prior failures of every node

    Each pick descends from the root: at every level each child still holding a prompt not picked this
    step draws p from the Beta posterior of its prompts' pooled successes and trials, and the child with
    the largest p(1 - p) (the learning signal a group of rollouts would get there) is taken; at the leaf,
    the prompt sampled least so far (seeded ties). BMC (McKenzie, Hansen and Wang 2026) organises
    problems into a hierarchical task tree over the model's latent representation space and applies
    Bayesian learning to guide sampling; the tree by recursive k-means of the initial policy's mean
    prompt hidden states, the pooled Beta posteriors and Thompson sampling on p(1 - p) are our choices.
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, *, threshold: float = 0.5,
                 branches: PositiveCount = 4, depth: PositiveCount = 2, prior_alpha: Positive = 1.0,
                 prior_beta: Positive = 1.0):
        super().__init__(num_prompts, seed, shuffle, threshold=threshold)
        self.branches, self.depth, self.prior = branches, depth, (prior_alpha, prior_beta)
        self.paths: torch.Tensor | None = None

    def set_features(self, features: torch.Tensor) -> None:
        """Build the task tree from each prompt's feature vector [num_prompts, D]."""
        if len(features) != self.num_prompts:
            raise ConfigError(f"sampler 'bmc': {len(features)} feature vectors for {self.num_prompts} prompts")
        self.paths = task_tree(features, self.branches, self.depth, self.seed)

    def node_score(self, rows: torch.Tensor, rng: random.Random) -> float:
        """p(1 - p) for p drawn from the Beta posterior of the pooled counts of the prompts `rows`."""
        s, t = float(self.successes[rows].sum()), float(self.trials[rows].sum())
        p = rng.betavariate(self.prior[0] + s, self.prior[1] + t - s)
        return p * (1 - p)

    def next(self, count: int) -> list[int]:
        if self.paths is None:
            raise ConfigError("sampler 'bmc' was given no prompt features (the trainer gives them at set-up)")
        self.draws += 1
        rng = random.Random(self.seed * 104729 + self.draws)
        tie = torch.randperm(self.num_prompts, generator=torch.Generator().manual_seed(self.seed * 7919 + self.draws))
        free = torch.ones(self.num_prompts, dtype=torch.bool)
        out: list[int] = []
        for _ in range(min(count, self.num_prompts)):
            rows = torch.nonzero(free).flatten()
            for level in range(self.depth):
                nodes = self.paths[rows, level].unique().tolist()
                best = max(nodes, key=lambda n: self.node_score(rows[self.paths[rows, level] == n], rng))
                rows = rows[self.paths[rows, level] == best]
            least = set(rows[self.trials[rows] == self.trials[rows].min()].tolist())
            pick = next(i for i in tie.tolist() if i in least)
            free[pick] = False
            out.append(pick)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "paths": None if self.paths is None else self.paths.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.paths = None if state.get("paths") is None else state["paths"].clone()
