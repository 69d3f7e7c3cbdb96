"""Rollout replay: rows of earlier steps re-used in later updates, at one point of the RL step
(after advantages, before the update; `algo.replay` names the plugin in the REPLAY registry).

A replay plugin is a class built as `cls(*, options)` with `mix(batch, step, pad_id) ->
(batch, metrics)` (the fresh batch with advantages in, fresh + replayed rows out) and
`state_dict()` / `load_state_dict()` (saved in checkpoints, so a resumed run replays exactly
what the uninterrupted one would). Replayed rows keep their advantages and the sampler's
log-probs of the policy that generated them, and lose old log-probs (the learner recomputes
them), so `algo.correction` (truncated importance sampling, pi_now / pi_sampler) is the
off-policy correction; each replay recipe turns it on.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import torch

from upslope.batch import Batch, concat
from upslope.bounds import Count, NonNegative, PositiveCount
from upslope.registry import REPLAY


def row_abs_advantage(batch: Batch) -> torch.Tensor:
    """Mean |advantage| over each row's trained tokens (the priority of a rollout)."""
    assert batch.advantages is not None
    mask = batch.loss_mask
    return (batch.advantages.abs() * mask).sum(1) / mask.sum(1).clamp(min=1)


class ReplayBuffer:
    """Stored rows (one Batch), the step each was admitted at and its replay-group key;
    subclasses choose what to admit (`admit`) and what to replay (`choose`)."""

    def __init__(self) -> None:
        self.rows: Batch | None = None
        self.born = torch.zeros(0, dtype=torch.long)
        self.key = torch.zeros(0, dtype=torch.long)  # rows with one key replay as one group
        self.next_key = 0

    def __len__(self) -> int:
        return len(self.born)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the stored rows at `index` (in that order)."""
        if self.rows is not None:
            self.rows = self.rows.select(index)
        self.born, self.key = self.born[index], self.key[index]

    def add(self, rows: Batch, step: int, keys: torch.Tensor, pad_id: int) -> None:
        """Store `rows` (their old log-probs dropped) admitted at `step` with replay-group `keys`."""
        rows = replace(rows, old_logprobs=None)
        self.rows = rows if self.rows is None or not len(self) else concat([self.rows, rows], pad_id)
        self.born = torch.cat([self.born, torch.full((rows.size,), step, dtype=torch.long)])
        self.key = torch.cat([self.key, keys.long() + self.next_key])
        self.next_key = int(self.key.max()) + 1 if len(self) else self.next_key

    def admit(self, batch: Batch, step: int, pad_id: int) -> None:
        raise NotImplementedError

    def choose(self, step: int) -> torch.Tensor:
        raise NotImplementedError

    def mix(self, batch: Batch, step: int, pad_id: int) -> tuple[Batch, dict[str, float]]:
        """Replay what `choose` picks from earlier steps (removed from the buffer), then admit the fresh rows."""
        pick = self.choose(step) if len(self) else torch.zeros(0, dtype=torch.long)
        out, metrics = batch, {"replay/rows": float(len(pick))}
        if len(pick):
            assert self.rows is not None
            old = self.rows.select(pick)
            metrics["replay/mean_age"] = float((step - self.born[pick]).float().mean())
            _, gid = torch.unique(self.key[pick], return_inverse=True)  # one group per replay key
            old = replace(old, group_ids=gid + int(batch.group_ids.max()) + 1)
            out = concat([replace(batch, old_logprobs=None), old], pad_id)
            self.keep(torch.tensor([i for i in range(len(self)) if i not in set(pick.tolist())], dtype=torch.long))
        self.admit(batch, step, pad_id)
        metrics["replay/buffer"] = float(len(self))
        return out, metrics

    def state_dict(self) -> dict[str, Any]:
        rows = None if self.rows is None else {f.name: getattr(self.rows, f.name) for f in fields(Batch)}
        return {"rows": rows, "born": self.born.clone(), "key": self.key.clone(), "next_key": self.next_key}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = None if state["rows"] is None else Batch(**state["rows"])
        self.born, self.key, self.next_key = state["born"].clone(), state["key"].clone(), state["next_key"]


@REPLAY.register("fresh_anchored")
class FreshAnchoredReplay(ReplayBuffer):
    """Fresh-anchored rollout replay: single rollouts are stored, evicted once older than tau
    steps, and replayed by |advantage| (largest first, ties to the older); every batch keeps all
    its fresh rollouts and gets up to `rows` replayed ones on top. Each stored rollout is
    replayed once (the abstract leaves reuse open; `max_uses` is not offered).

    tau: most steps a stored rollout may age before it is evicted
    rows: replayed rollouts appended to each batch
    capacity: most rollouts stored (the lowest |advantage| are dropped first)
    min_abs_advantage: rollouts with a smaller mean |advantage| are not stored (0-advantage rows teach nothing)
    """

    def __init__(self, *, tau: Count = 4, rows: Count = 16, capacity: PositiveCount = 256,
                 min_abs_advantage: NonNegative = 1e-6):
        super().__init__()
        self.tau, self.rows_per_step, self.capacity, self.min_abs = tau, rows, capacity, min_abs_advantage
        self.priority = torch.zeros(0)

    def keep(self, index: torch.Tensor) -> None:
        super().keep(index)
        self.priority = self.priority[index]

    def choose(self, step: int) -> torch.Tensor:
        self.keep(torch.nonzero(step - self.born <= self.tau).flatten())  # age eviction first
        order = torch.argsort(self.priority, descending=True, stable=True)  # stored oldest first: ties to older
        return order[:self.rows_per_step]

    def admit(self, batch: Batch, step: int, pad_id: int) -> None:
        prio = row_abs_advantage(batch)
        idx = torch.nonzero(prio >= self.min_abs).flatten()
        if len(idx):
            self.add(batch.select(idx), step, torch.arange(len(idx)), pad_id)
            self.priority = torch.cat([self.priority, prio[idx]])
        if len(self) > self.capacity:
            top = torch.argsort(self.priority, descending=True, stable=True)[:self.capacity]
            self.keep(top.sort().values)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "priority": self.priority.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.priority = state["priority"].clone()


@REPLAY.register("rerule")
class ReRULEReplay(ReplayBuffer):
    """ReRULE: whole groups whose mean reward is below `hard_below` (and not all equal, so they
    carry a GRPO signal) are stored during the first `store_steps` steps and replayed later, from
    `replay_from` on, `groups` a step, oldest first, each once; the replayed rows are corrected
    by importance sampling against their sampler log-probs (algo.correction).

    hard_below: a group is hard when its mean reward is below this
    store_steps: groups are stored during steps [0, store_steps)
    replay_from: first step at which stored groups are replayed
    groups: stored groups replayed per step
    capacity: most groups stored (later hard groups are not stored once full)
    """

    def __init__(self, *, hard_below: float = 0.5, store_steps: Count = 20, replay_from: Count = 20, groups: Count = 2,
                 capacity: PositiveCount = 64):
        super().__init__()
        self.hard_below, self.store_steps, self.replay_from = hard_below, store_steps, replay_from
        self.groups, self.capacity = groups, capacity

    def choose(self, step: int) -> torch.Tensor:
        if step < self.replay_from:
            return torch.zeros(0, dtype=torch.long)
        first = torch.unique(self.key)[:self.groups]  # keys grow with admission: oldest first
        return torch.nonzero(torch.isin(self.key, first)).flatten()

    def admit(self, batch: Batch, step: int, pad_id: int) -> None:
        if step >= self.store_steps or batch.rewards is None:
            return
        for g in batch.group_ids.unique():
            if len(torch.unique(self.key)) >= self.capacity:
                return
            rows = torch.nonzero(batch.group_ids == g).flatten()
            r = batch.rewards[rows].float()
            if float(r.mean()) < self.hard_below and bool((r != r[0]).any()):
                self.add(batch.select(rows), step, torch.zeros(len(rows)), pad_id)
