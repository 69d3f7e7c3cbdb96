"""The DARTS filter against hand-computed cases."""
from __future__ import annotations

import torch

from upslope.batch import build_batch
from upslope.registry import FILTERS, REPLAY


def _group(lengths, mean_lps, rewards):
    b = build_batch([[1]] * len(lengths), [[5] * n for n in lengths], [[lp] * n for n, lp in zip(lengths, mean_lps)],
                    [0] * len(lengths), [False] * len(lengths), 2)
    b.rewards = torch.tensor(rewards, dtype=torch.float32)
    return b


def test_darts_scores_and_balance_by_hand():
    """Lengths 2, 4, 4, 2 (max 4), mean log-probs -0.1, -0.1, -1.0, -2.0, length_coef 1: scores -0.6, -1.1,
    -2.0, -2.5. Rewards 1, 1, 0, 0, keep 2, balanced: the best right (row 0) and the best wrong (row 2)."""
    b = _group([2, 4, 4, 2], [-0.1, -0.1, -1.0, -2.0], [1.0, 1.0, 0.0, 0.0])
    from upslope.algos.exploration import darts_scores

    assert torch.allclose(darts_scores(b, length_coef=1.0), torch.tensor([-0.6, -1.1, -2.0, -2.5]))
    keep = FILTERS.bind("darts", {"keep": 2})(b)
    assert keep.tolist() == [True, False, True, False]
    unbalanced = FILTERS.bind("darts", {"keep": 2, "balance": False})(b)
    assert unbalanced.tolist() == [True, True, False, False]  # the top two by score: the group loses its variance
    confidence_only = FILTERS.bind("darts", {"keep": 1, "length_coef": 0.0, "balance": False})(b)
    assert confidence_only.tolist() == [True, False, False, False]  # tie (-0.1, -0.1): the earlier row


def test_darts_keeps_a_mixed_group_mixed():
    """One right of four, keep 2: round(0.5) = 0 right would empty the variance, so the right one is kept
    with the best wrong one (row 3, log-prob -0.1)."""
    b = _group([3, 3, 3, 3], [-3.0, -0.5, -0.2, -0.1], [1.0, 0.0, 0.0, 0.0])
    keep = FILTERS.bind("darts", {"keep": 2})(b)
    assert keep.tolist() == [True, False, False, True]
    assert int(keep.sum()) == 2


def _step(rewards, ids, groups, lengths=None):
    lengths = lengths or [2] * len(rewards)
    b = build_batch([[1]] * len(rewards), [[5] * n for n in lengths], [[-0.5] * n for n in lengths], groups,
                    [False] * len(rewards), 2, meta=[{"example_id": e} for e in ids])
    b.rewards = torch.tensor(rewards, dtype=torch.float32)
    b.advantages = torch.zeros_like(b.loss_mask)
    return b


def test_drift_routes_hard_problems_to_their_buffered_success():
    """Step 1: problem A mixed (row 0 right) -> A's success is buffered; B all wrong, nothing buffered.
    Step 2: A all wrong -> A's success comes back as its own group with advantage 2.0 on its 3 tokens;
    B still all wrong and unsolved -> nothing; C mixed -> buffered too."""
    drift = REPLAY.bind("drift", {"distill_weight": 2.0})()
    out, m = drift.mix(_step([1.0, 0.0, 0.0, 0.0], ["A", "A", "B", "B"], [0, 0, 1, 1], [3, 2, 2, 2]), 1, 2)
    assert out.size == 4 and m["drift/buffer"] == 1.0 and m["drift/hard_groups"] == 1.0
    out, m = drift.mix(_step([0.0, 0.0, 0.0, 0.0, 1.0, 0.0], ["A", "A", "B", "B", "C", "C"], [0, 0, 1, 1, 2, 2]), 2, 2)
    assert out.size == 7 and m["drift/distilled_rows"] == 1.0 and m["drift/buffer"] == 2.0
    assert out.group_ids[-1] == 3 and out.meta[-1]["example_id"] == "A"
    p = int(out.prompt_lens[-1])
    assert out.advantages[-1, p:p + 3].tolist() == [2.0, 2.0, 2.0] and out.advantages[-1, :p].sum() == 0
    state = drift.state_dict()  # checkpointed: a fresh copy routes the same way
    again = REPLAY.bind("drift", {"distill_weight": 2.0})()
    again.load_state_dict(state)
    assert again.mix(_step([0.0, 0.0], ["C", "C"], [0, 0]), 3, 2)[1]["drift/distilled_rows"] == 1.0


def test_drift_rhythm_gate_by_hand():
    """Row 0's four tokens have log-probs -0.1, -2.0, -0.5, -2.0: with share 0.5 the two most surprising (the
    -2.0s) keep their advantage, the others get floor 0.25; share 0.25 keeps one, the earlier of the tie.
    Row 1 (two tokens, -0.3 and -0.2): ceil(0.5 x 2) = 1, the -0.3. Gating starts at gate_from_step."""
    from upslope.algos.exploration import rhythm_gate

    b = build_batch([[1], [1]], [[5] * 4, [5] * 2], [[-0.1, -2.0, -0.5, -2.0], [-0.3, -0.2]], [0, 0],
                    [False, False], 2, meta=[{"example_id": "A"}, {"example_id": "A"}])
    p = 1
    gate = rhythm_gate(b, 0.5, 0.25)
    assert gate[0, p:p + 4].tolist() == [0.25, 1.0, 0.25, 1.0] and gate[1, p:p + 2].tolist() == [1.0, 0.25]
    assert gate[0, :p].sum() == 0 and gate[1, p + 2:].sum() == 0
    assert rhythm_gate(b, 0.25, 0.0)[0, p:p + 4].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert rhythm_gate(b, 1.0, 0.0)[0, p:p + 4].tolist() == [1.0] * 4
    b.rewards = torch.tensor([1.0, 0.0])
    b.advantages = b.loss_mask.float() * torch.tensor([[1.0], [-1.0]])
    drift = REPLAY.bind("drift", {"gate_share": 0.5, "gate_floor": 0.25, "gate_from_step": 3})()
    assert torch.equal(drift.mix(b, 2, 2)[0].advantages, b.advantages)  # stage one: every token learns
    out = drift.mix(b, 3, 2)[0]
    assert out.advantages[0, p:p + 4].tolist() == [0.25, 1.0, 0.25, 1.0] and out.advantages[1, p:p + 2].tolist() == [-1.0, -0.25]
