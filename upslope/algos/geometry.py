"""GEOALIGN: the geometry of the rollouts' hidden states curates a batch. Registered with
`features="hidden_mean"`: the RL trainer runs one forward of the policy's decoder over the batch and
passes each rollout's mean last-layer hidden state [N, D] (`upslope.train.learner.salience`)."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import NonNegative, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def displacements(features: Tensor, rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """([N, D], [N] bool): each rollout's reward-ordered displacement within its prompt, its feature minus
    the mean feature of its group's rollouts with a lower reward, and whether it has one (a rollout with no
    lower-rewarded group-mate has none)."""
    f, r = features.to(torch.float64), rewards.to(torch.float64)
    out, has = torch.zeros_like(f), torch.zeros(len(r), dtype=torch.bool)
    for g in group_ids.unique():
        rows = torch.nonzero(group_ids == g).flatten()
        for i in rows.tolist():
            lower = rows[r[rows] < r[i]]
            if lower.numel():
                out[i], has[i] = f[i] - f[lower].mean(0), True
    return out, has


def consensus_alignment(vectors: Tensor, dim: int) -> Tensor:
    """[M]: the cosine of each vector, projected, to the consensus prototype. The projector is the top `dim`
    right singular vectors of the (uncentred) vectors, the directions that hold most of their energy; the
    prototype is the mean of the projected unit vectors. A vector whose projection is 0 scores 0."""
    v = vectors.to(torch.float64)
    _, _, vh = torch.linalg.svd(v, full_matrices=False)
    z = v @ vh[:dim].T
    u = z / z.norm(dim=1, keepdim=True).clamp(min=1e-300)
    c = u.mean(0)
    return u @ (c / c.norm().clamp(min=1e-300))


def outliers(alignment: Tensor, tolerance: float) -> Tensor:
    """[M] bool: alignments more than `tolerance` population standard deviations below their mean."""
    a = alignment.to(torch.float64)
    return a < a.mean() - tolerance * a.std(unbiased=False)


@ADVANTAGES.register("geoalign", grouped=True, whole_batch=True, features="hidden_mean")
def geoalign(batch: Batch, features: Tensor | None = None, *, dim: PositiveCount = 8,
             tolerance: NonNegative = 1.0) -> Tensor:
    """GEOALIGN: a rollout whose reward-ordered displacement points away from the batch consensus is dropped,
    and its group's GRPO advantage is taken over the stable rollouts that remain.

    dim: directions the projector keeps (the top singular vectors of the batch's displacements)
    tolerance: a rollout is flagged when its alignment is this many standard deviations below the batch mean

    GEOALIGN (2026) forms within-prompt preference pairs, projects the rollouts' reward-ordered hidden-state
    displacements, flags the rollouts whose direction deviates from a batch consensus prototype and
    rectifies them with within-prompt stable alternatives, forward pass only. Here a rollout's displacement
    is its mean last-layer hidden state minus the mean of its lower-rewarded group-mates'; the projector is
    the displacements' top singular directions (closed form, where the paper learns one online); a flagged
    rollout gets advantage 0 and its group is normalised over the rest, whose signal stands in for it: our
    choices. Groups without a reward difference have no displacement and are GRPO's.
    """
    if features is None or features.shape[0] != batch.size:
        raise ConfigError("advantage 'geoalign' needs each rollout's hidden-state features (the RL trainer computes them)")
    if batch.rewards is None:
        raise ConfigError("advantage 'geoalign' needs batch.rewards (score the batch first)")
    moves, has = displacements(features, batch.rewards, batch.group_ids)
    flagged = torch.zeros(batch.size, dtype=torch.bool)
    if bool(has.any()):
        flagged[has] = outliers(consensus_alignment(moves[has], dim), tolerance)
    kept = torch.nonzero(~flagged).flatten()
    adv = torch.zeros(batch.size, dtype=torch.float64)
    if kept.numel():
        adv[kept] = group_normalize(batch.rewards.to(torch.float64)[kept], batch.group_ids[kept]).to(torch.float64)
    return broadcast_to_tokens(adv, batch.loss_mask).float()
