"""Exploration plugins: which of an over-sampled group's rollouts to train on (DARTS),
and which problems learn by RL or by self-distillation from a success buffer (DRIFT)."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from upslope.algos.replay import ReplayBuffer
from upslope.batch import Batch, concat
from upslope.bounds import Fraction, NonNegative, PositiveCount
from upslope.registry import FILTERS, REPLAY


def darts_scores(batch: Batch, *, length_coef: float) -> Tensor:
    """Per sample: confidence (mean sampler log-prob of its tokens) minus length_coef x its token count
    relative to the longest completion of the batch (higher: more confident and more concise)."""
    gen = (batch.loss_mask > 0).float()
    tokens = gen.sum(1).clamp(min=1)
    confidence = (batch.sampler_logprobs * gen).sum(1) / tokens
    return confidence - length_coef * tokens / tokens.max()


@FILTERS.register("darts", whole_batch=True)
def darts(batch: Batch, *, keep: PositiveCount = 8, length_coef: NonNegative = 1.0, balance: bool = True) -> Tensor:
    """DARTS: over-sample each group (rollout.n > keep), then keep the `keep` most concise and confident.

    keep: rollouts kept per group (the group size the update sees)
    length_coef: weight of conciseness against confidence in the score (0: confidence only)
    balance: keep right and wrong rollouts (reward >= 0.5) in the group's proportion, best-scored of each,
    so selection never empties a group's reward variance; false: the top `keep` regardless of reward

    The abstract does not fix the score; a shorter completion and a higher mean token log-prob both
    count, and ties keep the earlier sample.
    """
    score = darts_scores(batch, length_coef=length_coef)
    right = (batch.rewards >= 0.5) if (balance and batch.rewards is not None) else torch.zeros(batch.size, dtype=torch.bool)
    kept = torch.zeros(batch.size, dtype=torch.bool)
    for g in batch.group_ids.unique():
        rows = torch.nonzero(batch.group_ids == g).flatten()
        k = min(keep, rows.numel())
        n_right = int(right[rows].sum())
        quota_right = round(k * n_right / rows.numel())  # 0 without balance: every row is "wrong"
        if 0 < n_right < rows.numel():  # a mixed group stays mixed
            quota_right = min(max(quota_right, 1), k - 1)
        for part, quota in ((rows[right[rows]], quota_right), (rows[~right[rows]], k - quota_right)):
            order = sorted(part.tolist(), key=lambda i: (-float(score[i]), i))
            kept[order[:quota]] = True
    return kept


def rhythm_gate(batch: Batch, share: float, floor: float) -> Tensor:
    """[N, L] token weights: in each row the ceil(share x its trained tokens) most surprising trained tokens under
    the sampler (highest -log p; ties: the earlier token) weigh 1, its other trained tokens `floor`, the rest 0."""
    trained = batch.loss_mask > 0
    surprise = torch.where(trained, -batch.sampler_logprobs.float(), torch.full_like(batch.sampler_logprobs, -torch.inf))
    order = torch.sort(surprise, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1]).expand_as(order).contiguous())
    top = torch.ceil(share * trained.sum(1, keepdim=True)).long()
    return torch.where(trained, torch.where(rank < top, 1.0, floor), 0.0)


@REPLAY.register("drift")
class DriftRouting(ReplayBuffer):
    """DRIFT: route each problem by its learning state. A group with mixed rewards trains by RL (as is), and
    its right rollouts go to a success buffer (the latest per problem); an all-wrong group is routed to
    self-distillation: the problem's buffered success is added as its own group with advantage
    `distill_weight` on every token (at ratio 1 that is distill_weight x its NLL). An all-right group
    carries GRPO advantage 0 already (it is not over-optimised).

    distill_weight: the constant advantage of a replayed success (0: no self-distillation)
    capacity: most problems in the success buffer (the oldest successes are dropped first)
    per_problem: successes kept per problem (the latest)

    gate_share: rhythm gating: share of each RL row's trained tokens, its most surprising under the sampler, that
    keep their full advantage (1: every token, no gating)
    gate_floor: weight of an RL row's other trained tokens' advantage (0: only the gated tokens learn)
    gate_from_step: the second stage of the curriculum starts here: gating applies from this step (1: always)

    Rhythm gating concentrates the RL update on critical positions; the abstract does not say how they
    are found, and we take the tokens the sampler found least likely (highest surprisal, no extra
    forward; the replayed successes are not gated). The two-stage curriculum is our reading of
    "from reliable behavior acquisition toward stable policy evolution": every token learns until
    `gate_from_step`, gated exploration after. A success stays in the buffer after replay (high-quality
    history is kept).
    """

    def __init__(self, *, distill_weight: NonNegative = 1.0, capacity: PositiveCount = 256,
                 per_problem: PositiveCount = 1, gate_share: Fraction = 1.0, gate_floor: Fraction = 0.0,
                 gate_from_step: PositiveCount = 1):
        super().__init__()
        self.weight, self.capacity, self.per_problem = distill_weight, capacity, per_problem
        self.gate_share, self.gate_floor, self.gate_from = gate_share, gate_floor, gate_from_step

    def mix(self, batch: Batch, step: int, pad_id: int) -> tuple[Batch, dict[str, float]]:
        assert batch.rewards is not None
        right = batch.rewards >= 0.5
        hard, solved = set(), []
        for g in batch.group_ids.unique():
            rows = torch.nonzero(batch.group_ids == g).flatten()
            n_right = int(right[rows].sum())
            if n_right == 0:
                hard.add(batch.meta[int(rows[0])].get("example_id"))
            elif n_right < len(rows):
                solved += rows[right[rows]].tolist()
        if self.gate_share < 1 and step >= self.gate_from and batch.advantages is not None:
            gate = rhythm_gate(batch, self.gate_share, self.gate_floor)
            batch = replace(batch, advantages=batch.advantages * gate.to(batch.advantages.dtype))
        out, metrics = batch, {"drift/hard_groups": float(len(hard))}
        stored = [m.get("example_id") for m in self.rows.meta] if self.rows is not None and len(self) else []
        pick = torch.tensor([i for i, e in enumerate(stored) if e in hard], dtype=torch.long)
        metrics["drift/distilled_rows"] = float(len(pick))
        if len(pick) and self.weight:
            assert self.rows is not None
            old = self.rows.select(pick)
            _, gid = torch.unique(self.key[pick], return_inverse=True)
            old = replace(old, group_ids=gid + int(batch.group_ids.max()) + 1, advantages=self.weight * old.loss_mask)
            out = concat([replace(batch, old_logprobs=None), old], pad_id)
        if solved:
            new = batch.select(torch.tensor(solved))
            ids = {m.get("example_id") for m in new.meta}
            if len(self):  # a problem keeps its latest `per_problem` successes
                assert self.rows is not None
                self.keep(torch.tensor([i for i, m in enumerate(self.rows.meta) if m.get("example_id") not in ids],
                                       dtype=torch.long))
            firsts = [i for i, m in enumerate(new.meta)
                      if [x.get("example_id") for x in new.meta[:i]].count(m.get("example_id")) < self.per_problem]
            keep = new.select(torch.tensor(firsts))
            self.add(keep, step, torch.arange(keep.size), pad_id)
            if len(self) > self.capacity:
                self.keep(torch.arange(len(self) - self.capacity, len(self)))
        metrics["drift/buffer"] = float(len(self))
        return out, metrics
