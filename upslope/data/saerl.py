"""SAERL: a sparse autoencoder fitted to the prompts' hidden states gives each prompt sparse features, and
three data operations read them: clusters in SAE space mixed moderately within a batch (diversity), a
difficulty proxy ordering the prompts easy to hard (curriculum), and a quality probe dropping prompts
(filter). Registered with `features="hidden_mean"`: at set-up the trainer gives the sampler each training
prompt's mean last-layer hidden state from the policy, and the SAE is fitted then, on the CPU."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from upslope.bounds import Fraction, NonNegative, PositiveCount
from upslope.data.bmc import kmeans
from upslope.data.samplers import OutcomeSampler
from upslope.errors import ConfigError
from upslope.registry import SAMPLERS


@dataclass
class SparseCodes:
    """What a fitted SAE says of each prompt: its codes [P, K] (non-negative) and reconstruction error [P]."""

    codes: torch.Tensor
    error: torch.Tensor


def fit_sae(x: torch.Tensor, latents: int, l1: float, steps: int, seed: int, lr: float = 1e-2) -> SparseCodes:
    """A one-layer sparse autoencoder on the standardised rows of x: z = relu(W_e x + b_e), x' = W_d z + b_d,
    trained full-batch with Adam on mean squared error + l1 x mean |z|_1 (decoder columns kept at unit norm,
    so the penalty cannot shrink codes by growing the decoder); seeded initialisation."""
    z_in = x.to(torch.float32)
    z_in = (z_in - z_in.mean(0)) / z_in.std(0, unbiased=False).clamp(min=1e-6)
    d = z_in.shape[1]
    gen = torch.Generator().manual_seed(seed)
    enc = (torch.randn(d, latents, generator=gen) / d ** 0.5).requires_grad_()
    dec = (torch.randn(latents, d, generator=gen) / latents ** 0.5).requires_grad_()
    b_e, b_d = torch.zeros(latents, requires_grad=True), torch.zeros(d, requires_grad=True)
    opt = torch.optim.Adam([enc, dec, b_e, b_d], lr=lr)

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.relu(z_in @ enc + b_e)
        return z, z @ (dec / dec.norm(dim=1, keepdim=True).clamp(min=1e-8)) + b_d

    for _ in range(steps):
        z, rec = forward()
        loss = ((rec - z_in) ** 2).mean() + l1 * z.abs().sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        z, rec = forward()
        return SparseCodes(z.detach(), ((rec - z_in) ** 2).mean(1).detach())


@dataclass
class DataPlan:
    """Per prompt: its SAE cluster, its rank from easiest (0) to hardest, and whether the quality probe keeps it."""

    cluster: torch.Tensor
    rank: torch.Tensor
    keep: torch.Tensor


def data_plan(sae: SparseCodes, clusters: int, drop_share: float, seed: int) -> DataPlan:
    """Clusters: k-means of the codes. Difficulty: the number of active latents (ties: the summed code), more
    concepts at once being harder. Quality: the `drop_share` of prompts the SAE reconstructs worst are dropped
    (atypical of the pool: what its features do not explain), at least one prompt kept."""
    n = len(sae.codes)
    active = (sae.codes > 0).sum(1).to(torch.float64)
    difficulty = active + sae.codes.sum(1).to(torch.float64) / (1 + float(sae.codes.sum(1).max()))
    rank = torch.empty(n, dtype=torch.long)
    rank[torch.argsort(difficulty, stable=True)] = torch.arange(n)
    keep = torch.ones(n, dtype=torch.bool)
    drop = min(int(drop_share * n), n - 1)
    if drop:
        keep[torch.argsort(sae.error, descending=True, stable=True)[:drop]] = False
    return DataPlan(kmeans(sae.codes, clusters, seed), rank, keep)


@SAMPLERS.register("saerl", features="hidden_mean")
class SaerlSampler(OutcomeSampler):
    """SAERL: batches mixing a few SAE-feature clusters, easy-to-hard by an SAE difficulty proxy, minus the SAE's worst-explained prompts.

    latents: width of the sparse autoencoder (its feature count)
    l1: weight of the codes' L1 penalty (sparsity)
    sae_steps: full-batch Adam steps of the SAE fit at set-up
    clusters: k-means clusters of the prompts' SAE codes
    mix: clusters a batch draws from (moderate mixing: more than one, fewer than all)
    drop_share: share of the prompts the quality probe drops (the worst reconstructed)
    start: share of the kept prompts (the easiest) open at the first draw
    ramp_draws: draws over which the open share rises linearly to all kept prompts

    SAERL (Jing et al. 2026) models diversity, difficulty and quality with SAE features: SAE-space clustering
    with moderate batch mixing, a difficulty proxy for easy-to-hard ordering and a quality probe for filtering.
    Our choices: the SAE is fitted at set-up to the policy's own mean prompt hidden states (no pretrained SAE
    here); difficulty is the number of active latents; the quality probe is the SAE's reconstruction error;
    each draw takes its prompts in turn from `mix` clusters (the next ones of a seeded cycle over the
    clusters), in each the least-sampled open prompt, filling from the other clusters when those run out.
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, *, latents: PositiveCount = 32,
                 l1: NonNegative = 0.05, sae_steps: PositiveCount = 300, clusters: PositiveCount = 8,
                 mix: PositiveCount = 2, drop_share: Fraction = 0.1, start: Fraction = 0.5,
                 ramp_draws: PositiveCount = 40):
        super().__init__(num_prompts, seed, shuffle)
        self.latents, self.l1, self.sae_steps, self.clusters = latents, l1, sae_steps, clusters
        self.mix, self.drop_share, self.start, self.ramp_draws = mix, drop_share, start, ramp_draws
        self.plan: DataPlan | None = None

    def set_features(self, features: torch.Tensor) -> None:
        """Fit the SAE to each prompt's feature vector [num_prompts, D] and derive the data plan."""
        if len(features) != self.num_prompts:
            raise ConfigError(f"sampler 'saerl': {len(features)} feature vectors for {self.num_prompts} prompts")
        sae = fit_sae(features, self.latents, self.l1, self.sae_steps, self.seed)
        self.plan = data_plan(sae, self.clusters, self.drop_share, self.seed)

    def open_prompts(self) -> torch.Tensor:
        """[P] bool: the kept prompts within the easiest open share at this draw (all kept ones once ramped)."""
        assert self.plan is not None
        kept = torch.nonzero(self.plan.keep).flatten()
        share = self.start + (1 - self.start) * min(1.0, (self.draws - 1) / self.ramp_draws)
        open_count = max(1, round(share * len(kept)))
        easiest = kept[torch.argsort(self.plan.rank[kept], stable=True)[:open_count]]
        out = torch.zeros(self.num_prompts, dtype=torch.bool)
        out[easiest] = True
        return out

    def round_robin(self, free: torch.Tensor, clusters: list[int], count: int, tie: list[int]) -> list[int]:
        """Up to `count` prompts of `free` taken in turn from `clusters`, in each the least-sampled one (ties:
        the order `tie`)."""
        assert self.plan is not None
        free, out = free.clone(), []
        while len(out) < count:
            took = False
            for c in clusters:
                cand = torch.nonzero(free & (self.plan.cluster == c)).flatten()
                if len(out) >= count or not len(cand):
                    continue
                least = set(cand[self.trials[cand] == self.trials[cand].min()].tolist())
                pick = next(i for i in tie if i in least)
                free[pick], took = False, True
                out.append(pick)
            if not took:
                break
        return out

    def next(self, count: int) -> list[int]:
        if self.plan is None:
            raise ConfigError("sampler 'saerl' was given no prompt features (the trainer gives them at set-up)")
        self.draws += 1
        tie = torch.randperm(self.num_prompts, generator=torch.Generator().manual_seed(self.seed * 104729 + self.draws))
        ids = sorted(self.plan.cluster.unique().tolist())
        cycle = [ids[i] for i in torch.randperm(len(ids), generator=torch.Generator().manual_seed(self.seed)).tolist()]
        order = [cycle[((self.draws - 1) * self.mix + j) % len(cycle)] for j in range(len(cycle))]
        mixed, others = order[:self.mix], order[self.mix:]
        tiers = (self.open_prompts(), self.plan.keep, torch.ones(self.num_prompts, dtype=torch.bool))
        out: list[int] = []
        picked = torch.zeros(self.num_prompts, dtype=torch.bool)
        while len(out) < count:  # the open prompts of the mixed clusters, then of the others, then beyond
            before = len(out)
            for tier in tiers:
                for clusters in (mixed, others):
                    got = self.round_robin(tier & ~picked, clusters, count - len(out), tie.tolist())
                    picked[got] = True
                    out += got
            if len(out) == before:  # more prompts asked than there are: another round
                picked[:] = False
        return out

    def state_dict(self) -> dict[str, Any]:
        plan = None if self.plan is None else {k: getattr(self.plan, k).clone() for k in ("cluster", "rank", "keep")}
        return {**super().state_dict(), "plan": plan}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.plan = None if state.get("plan") is None else DataPlan(**{k: v.clone() for k, v in state["plan"].items()})

