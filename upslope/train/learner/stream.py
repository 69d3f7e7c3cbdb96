"""The streamed update (the Ray pipeline): one optimiser step over a batch whose groups arrive in pieces
(the Ray rollout workers' jobs), started before the last piece is in.

The loss of a mini-batch is a sum over its rows divided by the mini-batch's token or sequence count
(`upslope.algos.aggregate`), a count known only once every piece has arrived. So each piece is
forwarded and backwarded with the loss left un-normalised (`aggregate.UNIT` counts), its counts are
added up, and once the batch is complete the summed gradients are divided by the objective's
normaliser of the whole batch, then clipped and stepped: the whole-batch update, up to float
rounding (a sum of gradients divided once instead of each divided first). Only what is exact per
group may run per piece: the caller keeps batch-level steps (an advantage that whitens over the
batch, several optimiser steps per batch) on the whole-batch update."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from upslope.algos.aggregate import UNIT, loss_normalizers
from upslope.batch import Batch, in_group_order
from upslope.train.learner.updater import Tally, Updater

if TYPE_CHECKING:
    from upslope.train.learner.objectives import Objective

Prepared = tuple[Batch, dict[str, Any]]  # a piece ready for the update, and what preparing it measured


class StreamedUpdate:
    """Pieces of one batch go in with `add` as they arrive; `work` forwards and backwards the oldest
    waiting one (the learner calls it while it would otherwise wait for rollouts); `finish` does the
    rest and the optimiser step. A batch none of whose pieces was worked on before it was complete is
    left to the caller's whole-batch update (`started` is False), which is then bit for bit the
    synchronous one."""

    def __init__(self, updater: Updater, objective: "Objective", prepare: Callable[[Batch], Prepared], pad_id: int):
        if objective.normalizer(UNIT) is None:
            raise ValueError(f"{type(objective).__name__} has no loss normaliser: its update cannot be streamed")
        self.updater, self.objective, self.prepare, self.pad_id = updater, objective, prepare, pad_id
        self.pending: list[Batch] = []  # arrived, not forwarded yet
        self.done: list[Prepared] = []  # forwarded: the prepared piece and its preparation's metrics
        self.counts = {k: 0.0 for k in UNIT}  # the batch's loss counts so far
        self.forwarded = 0  # rows forwarded (skipped rows are counted but not forwarded)
        self.tally = Tally()

    def add(self, piece: Batch) -> None:
        """A piece of whole groups that belongs to the batch (kept by collect's filters)."""
        self.pending.append(piece)

    @property
    def started(self) -> bool:
        """Has any piece been forwarded?"""
        return bool(self.done)

    def work(self) -> bool:
        """Prepare, forward and backward the oldest waiting piece (loss un-normalised); False if none waits."""
        if not self.pending:
            return False
        piece, measured = self.prepare(self.pending.pop(0))
        piece = self.updater.prepared(piece, self.objective)
        for k, v in loss_normalizers(piece.loss_mask).items():  # every row counts, skipped or not
            self.counts[k] += v
        self.forwarded += self.updater.accumulate(piece, self.objective, UNIT, self.tally)
        self.done.append((piece, measured))
        return True

    def finish(self) -> tuple[Batch, dict[str, float], list[Prepared]]:
        """Forward what is still waiting, divide the summed gradients (and loss) by the whole batch's
        normaliser, step: the prepared batch, the update's metrics, and each prepared piece with what
        preparing it measured (for the caller to combine)."""
        while self.work():
            pass
        norm = float(self.objective.normalizer(self.counts) or 1.0)
        for p in self.updater.model.parameters():
            if p.grad is not None:
                p.grad.div_(norm)
        self.tally.mine["loss"] /= norm
        self.updater.optimizer_step(self.forwarded, self.tally)
        batch = in_group_order([p for p, _ in self.done], self.pad_id)
        return batch, self.updater.update_metrics(self.tally, self.objective, batch), list(self.done)

