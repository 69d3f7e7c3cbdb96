"""GEOALIGN: the geometry of the rollouts' hidden states curates a batch. Registered with
`features="hidden_mean"`: the RL trainer runs one forward of the policy's decoder over the batch and
passes each rollout's mean last-layer hidden state [N, D] (`upslope.train.learner.salience`)."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import Fraction, NonNegative, Positive, PositiveCount
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
        raise ConfigError("advantage 'geoalign' needs each rollout's hidden-state features (the RL trainer "
                          "computes them)")
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


def is_labelled(metas: list[dict], share: float, key: str) -> Tensor:
    """[N] bool: a sample's meta[key] when it has one, else whether its example falls in the labelled `share`
    (crc32 of its example_id, so every sample of an example, and every step, agrees)."""
    import zlib

    out = []
    for i, m in enumerate(metas):
        if key in m:
            out.append(bool(m[key]))
        else:
            out.append(zlib.crc32(str(m.get("example_id", i)).encode()) % 10_000 < share * 10_000)
    return torch.tensor(out, dtype=torch.bool)


def right_posterior(features: Tensor, right: Tensor, wrong: Tensor, eps: float) -> Tensor | None:
    """[N]: P(right | feature) under two Gaussians fitted to the `right` and `wrong` rows (class means, one
    shared diagonal variance pooled within the classes, plus eps), the share of right among them as the
    prior; None when either class has no row."""
    f = features.to(torch.float64)
    pos, neg = f[right], f[wrong]
    if not len(pos) or not len(neg):
        return None
    mu_p, mu_n = pos.mean(0), neg.mean(0)
    var = (((pos - mu_p) ** 2).sum(0) + ((neg - mu_n) ** 2).sum(0)) / max(len(pos) + len(neg) - 2, 1) + eps
    logit = (f - (mu_p + mu_n) / 2) @ ((mu_p - mu_n) / var) + torch.log(torch.tensor(len(pos) / len(neg)))
    return torch.sigmoid(logit)


@ADVANTAGES.register("geomin", grouped=True, whole_batch=True, features="hidden_mean")
def geomin(batch: Batch, features: Tensor | None = None, *, correct: str = "correct", self_reward: str = "self",
           labelled_share: Fraction = 0.1, labelled_key: str = "labelled", eps: Positive = 1e-3,
           fallback_weight: Fraction = 0.0) -> Tensor:
    """GeoMin: GRPO on the verifier where a prompt is labelled; elsewhere on the self-reward, each rollout
    weighted by how far the right/wrong feature distributions of the labelled rollouts back its self-reward.

    correct: the reward component of the verifier (read on labelled prompts only)
    self_reward: the reward component of the label-free self-reward (e.g. majority_vote)
    labelled_share: share of the examples treated as labelled (by example id) when a sample's meta has no labelled_key
    labelled_key: meta field marking an example as labelled (true) or not
    eps: added to the pooled per-dimension variance of the feature model
    fallback_weight: weight of the unlabelled rollouts in a batch whose labelled rollouts are all right or all wrong

    GeoMin (Zhu et al. 2026) models the feature distributions of correct and incorrect rollouts on labelled
    data as a prior on the reliability of self-rewards on unlabelled data. Here: the batch's labelled
    rollouts fit two Gaussians (class means, a shared diagonal variance) over the rollouts' mean
    last-layer hidden states; an unlabelled rollout's weight is P(right | features) when its self-reward
    says right, P(wrong | features) when it says wrong, times its GRPO advantage on the self-reward. The
    per-batch fit, the diagonal Gaussians and the multiplicative weight are our choices.
    """
    if features is None or features.shape[0] != batch.size:
        raise ConfigError("advantage 'geomin' needs each rollout's hidden-state features (the RL trainer "
                          "computes them)")
    comps = batch.reward_components or {}
    missing = [k for k in (correct, self_reward) if k not in comps]
    if missing:
        raise ConfigError(f"advantage 'geomin': no reward component {missing} (components: {sorted(comps)}); name them "
                          f"with the options correct and self_reward")
    lab = is_labelled(batch.meta, labelled_share, labelled_key)
    y, s = comps[correct].to(torch.float64), comps[self_reward].to(torch.float64)
    post = right_posterior(features, lab & (y >= 0.5), lab & (y < 0.5), eps)
    trust = torch.full((batch.size,), fallback_weight, dtype=torch.float64) if post is None \
        else torch.where(s >= 0.5, post, 1 - post)
    adv = group_normalize(torch.where(lab, y, s), batch.group_ids).to(torch.float64)
    return broadcast_to_tokens(adv * torch.where(lab, torch.ones_like(trust), trust), batch.loss_mask).float()
