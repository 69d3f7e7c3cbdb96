"""Token-credit advantages: a GRPO advantage redistributed over a rollout's tokens
(AH-GRPO, SA-AH-GRPO, RREDCoT) or over a group's similar rollouts (GraphAE); BALTO's balanced token
labels from verified claims added to it.

The per-token signal is the sampler's surprisal -log p(sampled token) (`batch.sampler_logprobs`):
it is in every batch, costs nothing, and is an unbiased one-sample estimate of the policy's entropy
at that position (E[-log p] = H). The exact entropy exists only inside the learner's forward, after
the advantage is fixed. A group whose rewards tie keeps advantage exactly 0 in every estimator here but
BALTO's, whose label term is its own signal.
"""
from typing import Literal

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import Fraction, NonNegative, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def grpo_per_sample(batch: Batch, who: str) -> Tensor:
    """GRPO's (r - group mean) / (group std + 1e-6) per sample [N], float64; 0 for a tied group."""
    if batch.rewards is None:
        raise ConfigError(f"advantage '{who}' needs batch.rewards (score the batch first)")
    return group_normalize(batch.rewards.to(torch.float64), batch.group_ids).to(torch.float64)


def surprisal(batch: Batch) -> Tensor:
    """-log p of each sampled token [N, L] float64, 0 off the trained tokens."""
    return torch.where(batch.loss_mask > 0, -batch.sampler_logprobs.to(torch.float64), torch.zeros((), dtype=torch.float64))


def horizon_weights(entropy: Tensor, mask: Tensor, alpha: float) -> Tensor:
    """exp(-alpha * sum of entropy over the trained tokens before t) [N, L]: 1 on each row's first token."""
    h = torch.where(mask > 0, entropy.to(torch.float64), torch.zeros((), dtype=torch.float64))
    before = h.cumsum(dim=1) - h
    return torch.exp(-alpha * before)


@ADVANTAGES.register("ah_grpo", grouped=True)
def ah_grpo(batch: Batch, *, alpha: NonNegative = 0.5, selective: bool = False) -> Tensor:
    """AH-GRPO / SA-AH-GRPO (Chawla et al. 2026): GRPO advantage x exp(-alpha x cumulative entropy before the token).

    alpha: discount per nat of cumulative entropy (>= 0; 0 is GRPO)
    selective: discount only negative-advantage rollouts (SA-AH-GRPO); positive ones keep full weight

    Our choices where the abstract is open: the cumulative entropy is the sum of the sampler's
    surprisal over the trained tokens strictly before t (so the first token keeps weight 1), and the
    discount is exp(-alpha x that sum), a product of per-token discounts exp(-alpha H_s).
    """
    if alpha < 0:
        raise ConfigError(f"ah_grpo alpha must be >= 0 (got {alpha})")
    adv = broadcast_to_tokens(grpo_per_sample(batch, "ah_grpo"), batch.loss_mask)
    w = horizon_weights(surprisal(batch), batch.loss_mask, alpha)
    if selective:
        w = torch.where(adv < 0, w, torch.ones_like(w))
    return (adv * w).float()


def segment_ids(mask: Tensor, segment_len: int) -> Tensor:
    """[N, L] long: index of the fixed-length segment of trained tokens each token is in (-1 off the mask)."""
    valid = mask > 0
    k = valid.long().cumsum(dim=1) - 1
    return torch.where(valid, torch.div(k, segment_len, rounding_mode="floor"), torch.full_like(k, -1))


def redistribution_weights(score: Tensor, mask: Tensor, segment_len: int, eps: float = 1e-3) -> Tensor:
    """Token weights [N, L] that give each segment a share (score + eps) / sum of the row's total weight,
    spread evenly over its tokens; the weights of a row sum to its number of trained tokens."""
    seg = segment_ids(mask, segment_len)
    n_seg = int(seg.max().item()) + 1 if seg.numel() else 0
    if n_seg <= 0:
        return torch.zeros_like(score, dtype=torch.float64)
    idx = seg.clamp(min=0)
    on = (mask > 0).to(torch.float64)
    seg_score = torch.zeros(score.shape[0], n_seg, dtype=torch.float64).scatter_add_(1, idx, score.to(torch.float64) * on)
    seg_size = torch.zeros_like(seg_score).scatter_add_(1, idx, on)
    share = torch.where(seg_size > 0, seg_score + eps, torch.zeros_like(seg_score))
    share = share / share.sum(dim=1, keepdim=True).clamp(min=1e-300)
    per_token = share / seg_size.clamp(min=1) * on.sum(dim=1, keepdim=True)
    return torch.gather(per_token, 1, idx) * on


@ADVANTAGES.register("rredcot", grouped=True)
def rredcot(batch: Batch, *, segment_len: PositiveCount = 4, mix: Fraction = 1.0) -> Tensor:
    """RREDCoT (Ielanskyi et al. 2026): the GRPO advantage redistributed over a rollout's segments by their surprisal.

    segment_len: trained tokens per segment (>= 1)
    mix: weight of the redistribution (0: GRPO's uniform credit; 1: fully redistributed)

    The paper estimates each segment's contribution with the model's own state values; we use the
    segment's summed surprisal under the sampler (the information it added, no extra forward) and
    fixed-length segments (a reply has no reliable step markers at this scale). The row's summed
    advantage is conserved: every token weight averages 1 over the row.
    """
    if segment_len < 1 or not 0 <= mix <= 1:
        raise ConfigError(f"rredcot needs segment_len >= 1 and 0 <= mix <= 1 (got {segment_len}, {mix})")
    adv = broadcast_to_tokens(grpo_per_sample(batch, "rredcot"), batch.loss_mask).to(torch.float64)
    w = redistribution_weights(surprisal(batch), batch.loss_mask, segment_len)
    return (adv * ((1 - mix) * (batch.loss_mask > 0) + mix * w)).float()


def jaccard_similarity(batch: Batch) -> Tensor:
    """[N, N] Jaccard similarity of the rows' sets of trained token ids (0 across groups and on the diagonal)."""
    sets = [set(batch.input_ids[i][batch.loss_mask[i] > 0].tolist()) for i in range(batch.size)]
    sim = torch.zeros(batch.size, batch.size, dtype=torch.float64)
    for i in range(batch.size):
        for j in range(i + 1, batch.size):
            if batch.group_ids[i] == batch.group_ids[j] and (sets[i] or sets[j]):
                sim[i, j] = sim[j, i] = len(sets[i] & sets[j]) / len(sets[i] | sets[j])
    return sim


RM_STATE = "reward_model_state"  # what the reward_model reward writes to each sample's meta with keep_states


def state_similarity(batch: Batch) -> Tensor:
    """[N, N] cosine similarity of the rows' reward-model hidden states (meta['reward_model_state']), negative
    similarities as 0, 0 across groups and on the diagonal."""
    h = torch.stack([torch.as_tensor(m[RM_STATE], dtype=torch.float64) for m in batch.meta])
    h = h / h.norm(dim=1, keepdim=True).clamp(min=1e-12)
    same = batch.group_ids[:, None] == batch.group_ids[None, :]
    sim = (h @ h.T).clamp(min=0) * same * (1 - torch.eye(batch.size, dtype=torch.float64))
    return sim


@ADVANTAGES.register("graphae", grouped=True)
def graphae(batch: Batch, *, lam: Fraction = 0.5, edges: Literal["auto", "reward_model", "jaccard"] = "auto") -> Tensor:
    """GraphAE (Li et al. 2026): each GRPO advantage mixed with its group neighbours', weighted by response similarity.

    lam: weight of the neighbours' similarity-weighted mean advantage (0: GRPO; 1: only the neighbours)
    edges: reward_model (cosine of the reward model's hidden states), jaccard (of the replies' token-id sets), auto (reward_model when every sample has its state, else jaccard)

    The paper's edges are similarities in the reward model's hidden space: the `reward_model` reward with
    `keep_states: true` keeps, per sample, the last hidden state its head reads, and the edge is their
    cosine similarity (negative as no edge; our choice of measure). With a verifier there is no reward
    model, and the edge is the Jaccard similarity of the replies' token-id sets. One propagation step:
    A'_i = (1 - lam) A_i + lam sum_j W_ij A_j / sum_j W_ij; a rollout with no similar neighbour keeps A_i.
    """
    if not 0 <= lam <= 1:
        raise ConfigError(f"graphae lam must be in [0, 1] (got {lam})")
    a = grpo_per_sample(batch, "graphae")
    have = batch.size > 0 and all(RM_STATE in m for m in batch.meta)
    if edges == "reward_model" and not have:
        raise ConfigError("graphae edges=reward_model: the samples carry no reward-model states; give the "
                          "reward_model reward keep_states: true")
    w = state_similarity(batch) if have and edges != "jaccard" else jaccard_similarity(batch)
    deg = w.sum(dim=1)
    neighbours = torch.where(deg > 0, (w @ a) / deg.clamp(min=1e-300), a)
    return broadcast_to_tokens(((1 - lam) * a + lam * neighbours).float(), batch.loss_mask)


def span_labels(token_rewards: Tensor, mask: Tensor, tol: float = 1e-6) -> Tensor:
    """[N, L] label in {-1, 0, +1} of each trained token: a token reward larger than `tol` in magnitude closes a
    span of trained tokens (from the one after the previous closing token) whose label is that reward's sign;
    trained tokens after a row's last closing token, and every untrained one, get 0. (The reward stage puts
    the float32 rounding of a reward's sum, ~1e-8, on the last token: not a label.)"""
    on = mask > 0
    closes = (token_rewards.abs() > tol) & on
    # the span a token is in: how many closing tokens come strictly before it
    span = closes.long().cumsum(dim=1) - closes.long()
    sign = torch.sign(token_rewards.to(torch.float64)) * closes
    n_spans = int(span.max().item()) + 1 if span.numel() else 0
    per_span = torch.zeros(mask.shape[0], max(n_spans, 1), dtype=torch.float64).scatter_add_(1, span, sign)
    closed = span < closes.long().sum(dim=1, keepdim=True)
    return torch.gather(per_span, 1, span) * (on & closed)


@ADVANTAGES.register("balto", grouped=True, token_rewards=True)
def balto(batch: Batch, *, outcome: str | None = None, outcome_coef: NonNegative = 1.0,
          label_coef: NonNegative = 1.0) -> Tensor:
    """BALTO (Li et al. 2026): a group-normalised outcome advantage plus balanced token labels from verified claims.

    outcome: the reward component whose GRPO advantage is the outcome term (default: the combined reward)
    outcome_coef: weight of the outcome term (0: token labels only)
    label_coef: weight of the balanced label term (0: GRPO)

    The labels come from a reward placed on tokens (the `claims` reward): each span of trained tokens
    ending where a placed part sits is labelled by the part's sign (+1 supported, -1 unsupported). Balanced
    credit, our choice where the abstract leaves it open: within each group the supported tokens share
    +T/2 and the unsupported tokens -T/2 (T: the group's labelled tokens, each class weighted T / (2 x its
    count)), so the label term sums to 0 over the group: it moves probability from unsupported to faithful
    tokens without pushing whole replies up or down, and a long reply weighs no more than its labels' share.
    A group with one class of labels only gets no label term. Other weighted rewards placed on the last
    token change the last span's sign, so the recipe gives them weight 0 and names them in `outcome`.
    """
    comps = batch.reward_components or {}
    if outcome is not None and outcome not in comps:
        raise ConfigError(f"advantage 'balto': no reward component {outcome!r} (components: {sorted(comps)})")
    r = comps[outcome] if outcome is not None else batch.rewards
    if r is None:
        raise ConfigError("advantage 'balto' needs batch.rewards (score the batch first)")
    adv = outcome_coef * broadcast_to_tokens(group_normalize(r.to(torch.float64), batch.group_ids), batch.loss_mask)
    if batch.token_rewards is None or label_coef == 0:
        return (adv * (batch.loss_mask > 0)).float()
    labels = span_labels(batch.token_rewards, batch.loss_mask)
    term = torch.zeros_like(labels)
    for g in batch.group_ids.unique().tolist():
        rows = batch.group_ids == g
        pos, neg = float((labels[rows] > 0).sum()), float((labels[rows] < 0).sum())
        if pos and neg:
            lab = labels[rows]
            term[rows] = torch.where(lab > 0, (pos + neg) / (2 * pos), (pos + neg) / (2 * neg)) * lab
    return ((adv.to(torch.float64) + label_coef * term) * (batch.loss_mask > 0)).float()
