"""The streamed update (pieces of a batch forwarded as they arrive, the loss normalised once at the
end) gives the whole-batch update on the real tiny model: the same gradients to float32 rounding
(sums taken in another order), and so the same weights, for every loss aggregation, with several
micro-batches per piece, over consecutive optimiser steps, whatever order the pieces arrive in.

Tolerances: gradients to 1e-5 of their largest entry. AdamW divides each gradient entry by its own
size + eps, so a rounding difference dg in an entry smaller than eps moves its weight by up to
lr * dg / eps: the weights are compared to 2e-5 (0.2% of one lr-sized step)."""
from __future__ import annotations

import pytest
import torch

from batch_helpers import grouped_rl_batch

from upslope.batch import Batch
from upslope.config import load_config
from upslope.train.learner.objectives import RLObjective, SupervisedObjective
from upslope.train.learner.stream import StreamedUpdate
from upslope.train.learner.updater import Updater

ADVANTAGES = [0.7, 0.0, -1.3, 0.4, 0.9]  # group 1 has no signal (its rows are skipped, still counted)


def learner(tiny_model_path: str, *extra: str) -> tuple[Updater, RLObjective]:
    """The tiny model on AdamW with an eps large enough that gradient noise of rounding size (where two
    summation orders differ in the last bits) cannot become an lr-sized step; 40-token micro-batches,
    so every piece of more than one row is forwarded in several; no clipping, so the gradients compared
    are the raw sums (a wrong scale cannot hide behind the clip)."""
    cfg = load_config(None, [f"model.name={tiny_model_path}", "train.precision=float32", "optim.lr=1e-2",
                             "optim.eps=1e-4", "optim.grad_clip=0", "train.micro_batch_tokens=40",
                             "rollout.max_new_tokens=8", *extra])
    torch.manual_seed(0)
    updater = Updater.from_config(cfg, tiny_model_path, "cpu")
    return updater, RLObjective.from_config(cfg)


WEIGHT_ATOL = 2e-5


def assert_same_grads(seen: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    assert len(seen) == len(want)
    for gs, gw in zip(seen, want):
        scale = max(float(g.abs().max()) for g in gw)
        for a, b in zip(gs, gw):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


def assert_same_weights(a: Updater, b: Updater, what: str = "") -> None:
    for (name, x), y in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=WEIGHT_ATOL, msg=f"{what} {name}")


def captured_grads(updater: Updater) -> list[list[torch.Tensor]]:
    """The gradients each optimiser step sees."""
    seen: list[list[torch.Tensor]] = []
    updater.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append([p.grad.clone() for g in opt.param_groups for p in g["params"]]))
    return seen


def groups(batch: Batch, ids: list[int]) -> Batch:
    return batch.select(torch.nonzero(torch.isin(batch.group_ids, torch.tensor(ids))).flatten())


def streamed(updater: Updater, objective: RLObjective, batch: Batch, order: list[list[int]]) -> tuple[Batch, dict]:
    """Pieces arrive in `order`; the learner works on each as soon as it is in (as it does while waiting)."""
    stream = StreamedUpdate(updater, objective, lambda piece: (piece, {}), pad_id=0)
    assert not stream.started
    for ids in order[:-1]:
        stream.add(groups(batch, ids))
        assert stream.work() and not stream.work()  # one piece waited; now none does
    stream.add(groups(batch, order[-1]))  # the last piece: forwarded by finish
    assert stream.started
    prepared, metrics, parts = stream.finish()
    assert len(parts) == len(order)
    return prepared, metrics


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_constant"])
def test_streamed_update_is_the_whole_batch_update(tiny_model_path, agg):
    """Two optimiser steps, each over 5 groups of 3 rows; streamed in 3 pieces (one out of order) vs
    the whole batch: gradients, weights after each step, loss and counts agree."""
    extra = (f"algo.loss_agg={agg}", "algo.correction.cap=2.0")  # with TIS weights against the sampler
    (u_whole, o_whole), (u_stream, o_stream) = learner(tiny_model_path, *extra), learner(tiny_model_path, *extra)
    g_whole, g_stream = captured_grads(u_whole), captured_grads(u_stream)
    for step, seed in ((1, 0), (2, 1)):
        batch = grouped_rl_batch(ADVANTAGES, n=3, seed=seed)
        m_whole = u_whole.update(batch, step, o_whole)
        prepared, m_stream = streamed(u_stream, o_stream, batch, [[2, 3], [0, 1], [4]])
        assert torch.equal(prepared.input_ids, batch.input_ids) and torch.equal(prepared.advantages, batch.advantages)
        assert m_stream["learner/tokens"] == m_whole["learner/tokens"]
        assert m_stream["learner/rows_skipped_frac"] == m_whole["learner/rows_skipped_frac"] == pytest.approx(7 / 15)
        assert m_stream["loss"] == pytest.approx(m_whole["loss"], rel=1e-5, abs=1e-7)
        assert m_stream["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
        assert m_stream["entropy"] == pytest.approx(m_whole["entropy"], rel=1e-6)
        assert_same_weights(u_stream, u_whole, f"step {step}:")
    assert len(g_whole) == 2
    assert_same_grads(g_stream, g_whole)


def test_one_row_pieces_with_one_micro_batch_each(tiny_model_path):
    """The finest stream: every group its own piece and a budget that holds a whole group, so a piece
    is one micro-batch where the whole batch needs several; the same update."""
    budget = "train.micro_batch_tokens=48"
    (u_whole, o_whole), (u_stream, o_stream) = learner(tiny_model_path, budget), learner(tiny_model_path, budget)
    g_whole, g_stream = captured_grads(u_whole), captured_grads(u_stream)
    batch = grouped_rl_batch(ADVANTAGES, n=3, seed=2)
    assert len(u_whole.micro_batches(batch)) > 1
    assert all(len(u_whole.micro_batches(groups(batch, [g]))) == 1 for g in range(len(ADVANTAGES)))
    m_whole = u_whole.update(batch, 1, o_whole)
    _, m_stream = streamed(u_stream, o_stream, batch, [[g] for g in range(len(ADVANTAGES))])
    assert m_stream["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
    assert_same_grads(g_stream, g_whole)
    assert_same_weights(u_stream, u_whole)


def test_an_objective_without_a_normaliser_cannot_stream(tiny_model_path):
    updater, _ = learner(tiny_model_path)
    with pytest.raises(ValueError, match="SupervisedObjective has no loss normaliser"):
        StreamedUpdate(updater, SupervisedObjective(dft=False), lambda piece: (piece, {}), pad_id=0)
