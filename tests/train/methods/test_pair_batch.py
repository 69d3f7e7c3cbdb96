"""Pair batches: layout, per-pair sequence log-probs, on-policy best/worst selection, and a
pair's two rows always in one micro-batch (shared prompt or not)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.batch import build_batch
from upslope.config import load_config
from upslope.errors import UpslopeError
from upslope.train.learner.updater import Updater
from upslope.train.methods.pair_batch import (best_worst_pairs, completion_slices, completion_values, pair_batch, pair_rows,
                                 sequence_logps)


def test_pair_batch_layout():
    b = pair_batch([[1, 2, 3], [4, 5]], [[6, 7], [8]], [[9], [10, 11, 12]], [7, 3], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 6, 7], [1, 2, 3, 9, 0], [4, 5, 8, 0, 0], [4, 5, 10, 11, 12]]
    assert b.group_ids.tolist() == [7, 7, 3, 3] and b.rewards.tolist() == [1, 0, 1, 0]
    assert b.prompt_lens.tolist() == [3, 3, 2, 2] and b.seq_lens.tolist() == [5, 4, 3, 5]
    assert b.loss_mask.tolist()[0] == [0, 0, 0, 1, 1] and b.loss_mask.tolist()[3] == [0, 0, 1, 1, 1]


def test_sequence_logps_pairs_rows_by_group_and_reward_in_any_order():
    b = pair_batch([[1, 2], [3]], [[4, 5], [6]], [[7], [8, 9]], [0, 1], pad_id=0)
    lp = torch.tensor([[9.0, 9, -1, -2], [9, 9, -3, 9], [9, -4, 9, 9], [9, -5, -6, 9]])  # 9 off the loss mask
    out = sequence_logps(lp, b)
    assert out.chosen.tolist() == [-3, -4] and out.rejected.tolist() == [-3, -11]
    assert out.chosen_tokens.tolist() == [2, 1] and out.rejected_tokens.tolist() == [1, 2]
    perm = [3, 0, 2, 1]
    shuffled = sequence_logps(lp[perm], b.select(perm))
    assert shuffled.chosen.tolist() == [-3, -4] and shuffled.rejected.tolist() == [-3, -11]


def test_a_split_pair_is_an_error():
    b = pair_batch([[1], [2]], [[3], [4]], [[5], [6]], [0, 1], pad_id=0)
    with pytest.raises(UpslopeError, match="exactly two rows"):
        sequence_logps(torch.zeros(3, 2), b.select([0, 1, 2]))
    b.rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    with pytest.raises(UpslopeError, match="equal rewards"):
        pair_rows(b.group_ids, b.rewards)


def test_best_worst_pairs_one_pair_per_group_with_differing_rewards():
    rewards = [0.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.2, 0.9, 0.2]
    gids = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    b = build_batch([[1, 2]] * 10, [[3 + i] for i in range(10)], [[0.0]] * 10, gids, [False] * 10, pad_id=0)
    b.rewards = torch.tensor(rewards)
    pairs = best_worst_pairs(b)
    # group 0: first best row 1, first worst row 0; group 1 all equal: none; group 2: best 8, worst 7
    assert pairs.input_ids[:, 2].tolist() == [4, 3, 11, 10]
    assert pairs.group_ids.tolist() == [0, 0, 2, 2] and pairs.rewards.tolist() == pytest.approx([1.0, 0.0, 0.9, 0.2])
    chosen, rejected = pair_rows(pairs.group_ids, pairs.rewards)
    assert chosen.tolist() == [0, 2] and rejected.tolist() == [1, 3]


def test_completion_values_round_trip():
    b = pair_batch([[1, 2], [3]], [[4, 5], [6]], [[7], [8, 9]], [0, 1], pad_id=0)
    vals = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0]), torch.tensor([-4.0]), torch.tensor([-5.0, -6.0])]
    full = completion_values(b, vals)
    assert full.tolist()[0] == [0, 0, -1, -2] and full.tolist()[3] == [0, -5, -6, 0]
    assert all(torch.equal(a, v) for a, v in zip(completion_slices(full, b), vals))
    assert torch.equal(full * b.loss_mask, full)


@pytest.fixture(scope="module")
def learners(tiny_model_path, tmp_path_factory):
    """Learners on the tiny model with share_prompt on and off (and a tiny micro-batch budget)."""
    out = {}
    for share in (True, False):
        cfg = load_config(None, [f"model.name={tiny_model_path}", f"train.share_prompt={share}",
                                 "train.micro_batch_tokens=16", "train.precision=float32"])
        out[share] = Updater.from_config(cfg, tiny_model_path, "cpu")
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=8),
       st.booleans(), st.integers(16, 64))
def test_whole_groups_keep_every_pair_in_one_micro_batch(learners, shapes, share, budget):
    """Whatever the lengths and the budget (even below one pair's size), a pair's two rows share
    a micro-batch and every row is in exactly one."""
    b = pair_batch([[1] * p for p, _, _ in shapes], [[2] * c for _, c, _ in shapes], [[3] * r for _, _, r in shapes],
                   list(range(len(shapes))), pad_id=0)
    learner = learners[share]
    learner.train_cfg.micro_batch_tokens = budget
    chunks = learner.micro_batches(b, whole_groups=True)
    rows = sorted(r for c in chunks for r in c)
    assert rows == list(range(b.size))
    for c in chunks:
        pair_rows(b.group_ids[c], b.rewards[c])  # raises if a pair is split


@pytest.mark.parametrize("share", [True, False], ids=["shared_prompt", "plain"])
def test_micro_batched_preference_loss_equals_the_whole_batch_loss(learners, tiny_model_path, share):
    """Summed micro-batch losses (normalised by the mini-batch's pair count) equal the loss of the
    whole batch in one forward pass, with the same gradient."""
    from upslope.algos.preference import sigmoid

    learner = learners[share]
    b = pair_batch([[5, 6, 7], [8, 9], [10, 11, 12, 13]], [[20, 21], [22], [23, 24, 25]], [[30], [31, 32], [33]],
                   [0, 1, 2], pad_id=0)
    b.ref_logprobs = completion_values(b, [torch.full((len(x),), -3.0) for x in ([20, 21], [30], [22], [31, 32],
                                                                                 [23, 24, 25], [33])])

    def loss_fn(lp, ent, mb, norms):
        out = sigmoid(sequence_logps(lp, mb), sequence_logps(mb.ref_logprobs, mb), beta=0.5)
        return out.loss.sum() / (norms["num_seqs"] / 2), {}

    def grads(budget):
        learner.train_cfg.micro_batch_tokens = budget
        learner.model.zero_grad(set_to_none=True)
        total = 0.0
        from upslope.algos.aggregate import loss_normalizers

        norms = loss_normalizers(b.loss_mask)
        chunks = learner.micro_batches(b, whole_groups=True)
        for idx in chunks:
            mb = b.select(idx)
            out = learner.forward(learner.model, mb, temperature=1.0)
            lp, ent = out.logprobs, out.entropy
            loss, _ = loss_fn(lp, ent, mb, norms)
            loss.backward()
            total += float(loss.detach())
        return total, len(chunks), [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]

    whole, n_whole, g_whole = grads(4096)
    split, n_split, g_split = grads(16)
    assert n_whole == 1 and n_split > 1
    assert split == pytest.approx(whole, rel=1e-5)
    for a, c in zip(g_whole, g_split):
        assert float((a - c).abs().max()) <= 1e-4 * float(a.abs().max()) + 1e-8  # float32 summation order
    learner.model.zero_grad(set_to_none=True)
