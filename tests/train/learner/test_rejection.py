"""Importance-correction rejection (algo.correction.mask_low / mask_high): a token (token level) or
row (sequence levels) whose ratio to the sampler falls outside the band is not trained and leaves
the loss's normalisers too, as verl's rollout rejection does. Before, its weight was 0 but it still
counted in the token and sequence counts, so every kept token's loss was scaled down."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from batch_helpers import grouped_rl_batch
from test_streamed_update import captured_grads, learner

from upslope.algos.aggregate import loss_normalizers
from upslope.batch import Batch
from upslope.config import load_config
from upslope.train.learner.logprobs import HeadOutput
from upslope.train.learner.objectives import RLObjective

BAND = "algo.correction={cap: 2.0, mask_low: 0.5, mask_high: 2.0}"


def objective(*extra: str) -> RLObjective:
    cfg = load_config(None, ["algo.loss_agg=token_mean", "algo.policy_loss.options={eps_low: 0.2, eps_high: 0.2}",
                             *extra])
    return RLObjective.from_config(cfg)


def rows(sampler_probs: list[list[float]]) -> Batch:
    """Rows of 4 trained tokens whose old policy gives each token p = 0.5, advantage +1."""
    n = len(sampler_probs)
    return Batch(input_ids=torch.zeros(n, 4, dtype=torch.long), attention_mask=torch.ones(n, 4, dtype=torch.bool),
                 loss_mask=torch.ones(n, 4), prompt_lens=torch.zeros(n, dtype=torch.long),
                 seq_lens=torch.full((n,), 4), group_ids=torch.zeros(n, dtype=torch.long),
                 sampler_logprobs=torch.tensor([[math.log(p) for p in r] for r in sampler_probs]),
                 old_logprobs=torch.full((n, 4), math.log(0.5)),
                 truncated=torch.zeros(n, dtype=torch.bool), policy_version=torch.zeros(n, dtype=torch.long),
                 advantages=torch.ones(n, 4))


def test_a_rejected_token_leaves_the_mask_and_the_token_count():
    """Ratios 1, 1, 1 and 0.5 / 0.1 = 5 (above mask_high 2): three tokens trained. With the old
    policy's own log-probs each kept token's loss is -1, so token_mean is -3 / 3 = -1 (it was
    -3 / 4 = -0.75 when the rejected token still counted)."""
    obj = objective(BAND)
    batch = obj.prepare(rows([[0.5, 0.5, 0.5, 0.1]]))
    assert batch.loss_mask.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    norms = loss_normalizers(batch.loss_mask)
    assert norms["num_tokens"] == 3.0
    loss = obj.loss(HeadOutput(batch.old_logprobs.clone().requires_grad_(), torch.zeros(1, 4)), batch, norms).loss
    assert loss.item() == pytest.approx(-1.0)
    assert obj.finish(batch)["tis/masked_frac"] == pytest.approx(0.25)
    assert obj.finish(batch)["tis/masked_frac"] == 0.0  # the count restarts with the next update


def test_sequence_level_rejects_whole_rows_and_counts_rows():
    """Row 1's sequence ratio is 1; row 2's is (0.5 / 0.1) x 1 x 1 x 1 = 5: rejected, so one sequence counts."""
    obj = objective("algo.correction={level: sequence, cap: 2.0, mask_high: 2.0}", "algo.loss_agg=seq_mean_token_mean")
    batch = obj.prepare(rows([[0.5] * 4, [0.1, 0.5, 0.5, 0.5]]))
    assert batch.loss_mask.tolist() == [[1.0] * 4, [0.0] * 4]
    assert loss_normalizers(batch.loss_mask)["num_seqs"] == 1.0
    assert obj.finish(batch)["tis/masked_frac"] == pytest.approx(0.5)


def test_without_a_band_nothing_is_rejected_and_no_forward_is_added():
    obj = objective("algo.correction={cap: 2.0}")
    assert not obj.needs_old_logprobs
    batch = rows([[0.5, 0.5, 0.5, 0.1]])
    assert obj.prepare(batch) is batch
    assert "tis/masked_frac" not in obj.finish(batch)


def test_the_update_equals_one_on_the_kept_tokens_only(tiny_model_path):
    """On the real tiny model: an update with the band gives the same gradient as an update without
    it on the batch whose rejected tokens were taken out of the loss mask by hand."""
    u_band, o_band = learner(tiny_model_path, BAND, "algo.loss_agg=token_mean")
    u_hand, o_hand = learner(tiny_model_path, "algo.correction={cap: 2.0}", "algo.loss_agg=token_mean")
    g_band, g_hand = captured_grads(u_band), captured_grads(u_hand)
    batch = grouped_rl_batch([0.7, -1.3, 0.4], n=3, seed=3)
    old = u_band.logprobs(batch, temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    shift = torch.tensor([0.0, 0.3, -0.4, 2.0, -2.0])[torch.randint(0, 5, old.shape, generator=gen)]  # log ratios
    batch = replace(batch, sampler_logprobs=(old - shift) * batch.loss_mask)
    rejected = (shift.abs() > math.log(2.0)) & (batch.loss_mask > 0)
    assert 0 < int(rejected.sum()) < int((batch.loss_mask > 0).sum())
    kept = batch.loss_mask * ~rejected
    by_hand = replace(batch, loss_mask=kept, advantages=batch.advantages * kept)
    m_band = u_band.update(batch, 1, o_band)
    u_hand.update(by_hand, 1, o_hand)
    scale = max(float(g.abs().max()) for g in g_hand[0])
    for a, b in zip(g_band[0], g_hand[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)
    assert m_band["tis/masked_frac"] == pytest.approx(float(rejected.sum()) / float((batch.loss_mask > 0).sum()))


def test_the_mismatch_metric_is_never_nan():
    """Both log-probs -inf on a trained token (a token neither policy can produce) counts as no gap."""
    from upslope.algos.terms import mismatch

    inf = float("inf")
    assert mismatch(torch.tensor([[-inf, -1.0]]), torch.tensor([[-inf, -1.5]]), torch.ones(1, 2)) == pytest.approx(0.25)
