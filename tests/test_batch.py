"""Batch.select and concat: the row/width bookkeeping every stage relies on, checked by hand."""
from __future__ import annotations

import torch

from upslope.batch import Batch, build_batch, concat

PAD = 9


def three_rows() -> Batch:
    """Rows: prompt [1, 2] + [3]; prompt [1, 2] + [4, 5, 6]; prompt [7] + [8, 8] (groups 0, 0, 1)."""
    b = build_batch([[1, 2], [1, 2], [7]], [[3], [4, 5, 6], [8, 8]], [[-0.1], [-0.2, -0.3, -0.4], [-0.5, -0.6]],
                    [0, 0, 1], [False, True, False], PAD, policy_version=3,
                    meta=[{"k": "a"}, {"k": "b"}, {"k": "c"}])
    b.rewards = torch.tensor([1.0, 0.0, 0.5])
    b.reward_components = {"r": torch.tensor([1.0, 0.0, 0.5])}
    return b


def test_build_batch_layout():
    b = three_rows()
    assert b.input_ids.tolist() == [[1, 2, 3, PAD, PAD], [1, 2, 4, 5, 6], [7, 8, 8, PAD, PAD]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert b.attention_mask.sum(1).tolist() == [3, 5, 3] == b.seq_lens.tolist()
    assert torch.allclose(b.sampler_logprobs[1], torch.tensor([0, 0, -0.2, -0.3, -0.4]))
    assert b.completion_lens.tolist() == [1, 3, 2] and b.num_groups == 2 and b.num_loss_tokens() == 6


def test_select_reorders_and_trims_to_the_longest_selected_row():
    b = three_rows()
    s = b.select([2, 0])
    assert s.input_ids.tolist() == [[7, 8, 8], [1, 2, 3]]  # width 3: the longest selected row
    assert s.loss_mask.tolist() == [[0, 1, 1], [0, 0, 1]]
    assert s.group_ids.tolist() == [1, 0] and s.truncated.tolist() == [False, False]
    assert s.rewards.tolist() == [0.5, 1.0] and s.reward_components["r"].tolist() == [0.5, 1.0]
    assert [m["k"] for m in s.meta] == ["c", "a"] and s.policy_version.tolist() == [3, 3]
    assert s.advantages is None  # unset optional fields stay unset
    assert b.input_ids.shape == (3, 5)  # the source is not changed


def test_select_nothing_is_an_empty_batch():
    e = three_rows().select([])
    assert e.size == 0 and e.input_ids.shape == (0, 0) and e.meta == []


def test_concat_pads_to_the_widest_and_keeps_group_ids():
    b = three_rows()
    short, long = b.select([0]), b.select([1, 2])
    long.advantages = torch.ones_like(long.loss_mask)
    out = concat([short, long], PAD)
    assert out.input_ids.tolist() == b.input_ids.tolist()  # the narrow part is padded with pad_id ...
    assert out.loss_mask.tolist() == b.loss_mask.tolist()  # ... and its masks with 0
    assert out.group_ids.tolist() == [0, 0, 1] and out.rewards.tolist() == [1.0, 0.0, 0.5]
    assert out.reward_components["r"].tolist() == [1.0, 0.0, 0.5] and [m["k"] for m in out.meta] == ["a", "b", "c"]
    assert out.advantages is None  # a field set on only some parts is dropped, not half-filled


def test_concat_of_one_batch_is_that_batch():
    b = three_rows()
    assert concat([b], PAD) is b


def routed(rows: list[list[int]]) -> torch.Tensor:
    """[tokens, 1 MoE layer, 2 experts]: token t routed to experts (v, v + 1) for each value v of `rows`."""
    return torch.tensor([[[v, v + 1]] for v in rows], dtype=torch.int16)


def test_routed_experts_follow_their_tokens_through_select_micro_batches_and_concat():
    """Each sample's recorded experts sit at its tokens' positions, -1 beyond its end, through every split."""
    experts = [routed([10, 11, 12]), routed([20, 21, 22, 23, 24]), routed([30, 31, 32])]
    b = build_batch([[1, 2], [1, 2], [7]], [[3], [4, 5, 6], [8, 8]], [[-0.1], [-0.2, -0.3, -0.4], [-0.5, -0.6]],
                    [0, 0, 1], [False, True, False], PAD, routed_experts=experts)
    assert b.routed_experts.shape == (3, 5, 1, 2) and b.routed_experts.dtype == torch.int16
    assert b.routed_experts[:, :, 0, 0].tolist() == [[10, 11, 12, -1, -1], [20, 21, 22, 23, 24], [30, 31, 32, -1, -1]]
    s = b.select([2, 0])
    assert s.routed_experts[:, :, 0, 1].tolist() == [[31, 32, 33], [11, 12, 13]]
    parts = list(b.micro_batches(max_tokens=6))  # the 5-token row alone, then the two 3-token rows
    assert [p.routed_experts[:, :, 0, 0].tolist() for p in parts] == [[[20, 21, 22, 23, 24]],
                                                                       [[10, 11, 12], [30, 31, 32]]]
    joined = concat([b.select([0]), b.select([1])], PAD)
    assert joined.routed_experts[:, :, 0, 0].tolist() == [[10, 11, 12, -1, -1], [20, 21, 22, 23, 24]]
    without = build_batch([[1]], [[2]], [[-0.1]], [0], [False], PAD, routed_experts=[None])
    assert without.routed_experts is None and concat([b.select([0]), without], PAD).routed_experts is None
