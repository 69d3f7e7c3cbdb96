"""Policy losses and loss aggregation: hand examples, gradient properties, masking, accumulation."""
import math

import pytest
import torch
from algos_strategies import bind_loss, token_tensors
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.aggregate import UNIT, aggregate, loss_normalizers, normalizer
from upslope.algos.losses import cispo, gspo, ppo_clip, reinforce
from upslope.errors import ConfigError
from upslope.registry import POLICY_LOSSES

FAST = settings(max_examples=60, deadline=None)
MODES = ("token_mean", "seq_mean_token_mean", "seq_sum_constant")


def _grad(fn, lp, old, adv, mask, mode="token_mean", **opt):
    lp = lp.clone().requires_grad_(True)
    loss, metrics = fn(lp, old, adv, mask, **opt)
    norm = loss_normalizers(mask)
    aggregate(loss, mask, mode, constant=7.0, **norm).backward()
    return loss.detach(), lp.grad, metrics


def test_ppo_clip_hand_example():
    old = torch.zeros(1, 3)
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    loss, m = ppo_clip(lp, old, adv, torch.ones(1, 3))
    # r=1.5,A=1: max(-1.5, -1.2) = -1.2 ; r=0.5,A=-1: max(0.5, 0.8) = 0.8 ; r=1,A=1: -1
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -1.0]]))
    assert m["clip_frac_high"].item() == pytest.approx(1 / 3) and m["clip_frac_low"].item() == pytest.approx(1 / 3)
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    # DAPO clip-higher: r=1.25 is inside [0.8, 1.28]
    loss, _ = ppo_clip(torch.log(torch.tensor([[1.25]])), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                       eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25)


def test_ppo_dual_clip_bounds_negative_advantage_loss():
    lp, old = torch.log(torch.tensor([[5.0, 5.0]])), torch.zeros(1, 2)
    adv, m = torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2)
    assert torch.allclose(ppo_clip(lp, old, adv, m)[0], torch.tensor([[5.0, -1.2]]))
    loss, metrics = ppo_clip(lp, old, adv, m, dual_clip=3.0)
    assert torch.allclose(loss, torch.tensor([[3.0, -1.2]]))  # min(max(5, 1.2), 3) = 3
    assert metrics["clip_frac_dual"].item() == pytest.approx(0.5)
    with pytest.raises(ConfigError):
        ppo_clip(lp, old, adv, m, dual_clip=0.5)


def test_cispo_and_reinforce_hand_example():
    lp = torch.log(torch.tensor([[0.5, 0.25]]))
    old = lp - torch.log(torch.tensor([[2.0, 0.5]]))  # ratios 2 and 0.5
    adv, m = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    loss, metrics = cispo(lp, old, adv, m)  # weights min(2, 1.28) = 1.28 and 0.5 (no lower clip)
    assert torch.allclose(loss, -torch.tensor([[1.28, 0.5]]) * lp)
    assert metrics["clip_frac_high"].item() == pytest.approx(0.5) and metrics["clip_frac_low"].item() == 0
    loss, _ = cispo(lp, old, adv, m, eps_low=0.2)  # 0.5 -> 0.8
    assert torch.allclose(loss, -torch.tensor([[1.28, 0.8]]) * lp)
    assert torch.allclose(reinforce(lp, old, adv, m)[0], -lp)


def test_gspo_hand_example():
    lp = torch.zeros(2, 2)
    old = torch.tensor([[0.0, -math.log(4.0)], [0.0, 0.0]])  # row 0: mean log-ratio log 2 -> s = 2
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = gspo(lp, old, torch.ones(2, 2), mask, eps_low=0.5, eps_high=2.0)
    assert torch.allclose(loss, torch.tensor([[-2.0, -2.0], [-1.0, 0.0]]))
    loss, m = gspo(lp, old, torch.ones(2, 2), mask)  # default eps_high 4e-4: row 0 clipped per sequence
    assert torch.allclose(loss, torch.tensor([[-1.0004, -1.0004], [-1.0, 0.0]]))
    assert m["clip_frac_high"].item() == pytest.approx(2 / 3)


@FAST
@given(token_tensors())
def test_ppo_gradient_is_zero_exactly_where_the_clip_applies(t):
    lp, old, adv, mask = t
    el, eh = 0.2, 0.28
    _, g_ppo, _ = _grad(ppo_clip, lp, old, adv, mask, eps_low=el, eps_high=eh)
    _, g_cis, _ = _grad(cispo, lp, old, adv, mask, eps_high=eh)
    r = torch.exp(lp - old)
    on = mask > 0
    clipped = on & (((adv > 0) & (r > 1 + eh)) | ((adv < 0) & (r < 1 - el)))
    inside = on & (r > 1 - el) & (r < 1 + eh)
    n = mask.sum()
    assert torch.all(g_ppo[clipped] == 0)
    assert torch.allclose(g_ppo[inside], (-adv * r / n)[inside])
    # CISPO keeps every token's gradient, clipped or not: -min(r, 1 + eh) * A / n
    assert torch.allclose(g_cis[on], (-r.clamp(max=1 + eh) * adv / n)[on])
    assert torch.all(g_cis[clipped & (adv.abs() > 1e-6)] != 0)


@FAST
@given(token_tensors(), st.sampled_from(MODES))
def test_at_ratio_one_clipped_losses_equal_reinforce(t, mode):
    lp, _, adv, mask = t
    adv = adv[:, :1].expand_as(adv).contiguous()  # sequence-level advantages, as GSPO assumes
    old = lp.detach()
    loss_pg, g_pg, _ = _grad(reinforce, lp, old, adv, mask, mode)
    for fn in (ppo_clip, gspo, cispo):
        loss, g, metrics = _grad(fn, lp, old, adv, mask, mode)
        assert torch.allclose(g, g_pg), fn.__name__
        assert metrics["clip_frac_low"] == 0 and metrics["clip_frac_high"] == 0
        # value: CISPO is -A * logprob like reinforce; the ratio forms are -A * ratio = -A at ratio 1
        target = loss_pg if fn is cispo else -adv * mask
        assert torch.allclose(loss, target), fn.__name__


@FAST
@given(token_tensors())
def test_gspo_ratio_is_constant_within_a_sequence_and_matches_sequence_gspo(t):
    lp, old, adv, mask = t
    adv = adv[:, :1].expand_as(lp).contiguous()  # GSPO: one advantage per sequence
    on = mask > 0
    # unclipped, A = 1: the per-token loss is -s_i on every trained token of row i
    loss, _ = gspo(lp, old, torch.ones_like(lp), mask, eps_low=0.99, eps_high=1e9)
    n = mask.sum(1).clamp(min=1)
    s = torch.exp(((lp - old) * mask).sum(1) / n)
    assert torch.allclose(loss[on], (-s[:, None]).expand_as(lp)[on])
    # gradient equals the sequence-level GSPO objective's, under seq_mean_token_mean
    _, g_tok, _ = _grad(gspo, lp, old, adv, mask, "seq_mean_token_mean")
    x = lp.clone().requires_grad_(True)
    s_seq = torch.exp(((x - old) * mask).sum(1) / n)
    a = adv[:, 0]
    per_seq = torch.maximum(-s_seq * a, -s_seq.clamp(1 - 3e-4, 1 + 4e-4) * a) * on.any(1)
    (per_seq.sum() / on.any(1).sum().clamp(min=1)).backward()
    assert torch.allclose(g_tok, x.grad, atol=1e-10)


@FAST
@given(token_tensors(), st.sampled_from(MODES))
def test_masked_positions_never_affect_loss_or_gradient(t, mode):
    lp, old, adv, mask = t
    off = mask == 0
    lp2 = lp.masked_fill(off, -math.inf)
    old2 = old.masked_fill(off, 50.0)
    adv2 = adv.masked_fill(off, math.nan)
    for name in POLICY_LOSSES.names():
        fn = bind_loss(name)
        l1, g1, m1 = _grad(fn, lp, old, adv, mask, mode)
        l2, g2, m2 = _grad(fn, lp2, old2, adv2, mask, mode)
        assert torch.all(l1[off] == 0) and torch.all(l2[off] == 0), name
        assert torch.allclose(l1, l2) and torch.allclose(g1, g2), name
        assert torch.all(g2[off] == 0) and torch.isfinite(g2).all(), name
        assert all(torch.allclose(m1[k], m2[k]) for k in m1), name


def test_aggregate_hand_example():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = loss_normalizers(mask)
    assert norm == {"num_tokens": 4.0, "num_seqs": 2.0}
    assert aggregate(loss, mask, "token_mean", **norm).item() == pytest.approx(10 / 4)  # 2.5
    assert aggregate(loss, mask, "seq_mean_token_mean", **norm).item() == pytest.approx((6 / 3 + 4 / 1) / 2)  # 3
    assert aggregate(loss, mask, "seq_sum_constant", constant=5, **norm).item() == pytest.approx(10 / (2 * 5))
    with pytest.raises(ConfigError):
        aggregate(loss, mask, "seq_sum_constant", **norm)
    with pytest.raises(ConfigError):
        aggregate(loss, mask, "token-mean", **norm)


@FAST
@given(token_tensors(max_rows=6), st.sampled_from(MODES), st.data())
def test_aggregate_over_micro_batches_sums_to_the_whole(t, mode, data):
    loss, _, _, mask = t
    norm = loss_normalizers(mask)
    whole = aggregate(loss, mask, mode, constant=11.0, **norm)
    perm = torch.as_tensor(data.draw(st.permutations(range(loss.shape[0]))))
    cuts = sorted(data.draw(st.lists(st.integers(0, loss.shape[0]), max_size=3)))
    parts = [perm[a:b] for a, b in zip([0] + cuts, cuts + [loss.shape[0]])]
    total = sum(aggregate(loss[p], mask[p], mode, constant=11.0, **norm) for p in parts)
    assert torch.allclose(total, whole)


@FAST
@given(token_tensors(max_rows=6), st.sampled_from(MODES), st.data())
def test_pieces_aggregated_unnormalised_then_divided_once_give_the_whole(t, mode, data):
    """The streamed update's arithmetic: rows arriving in pieces, each aggregated with UNIT counts (the
    mini-batch's are unknown until the last piece), the sum divided by `normalizer` of the piece counts
    summed: the whole-batch loss, and so its gradient."""
    loss, _, _, mask = t
    whole = aggregate(loss, mask, mode, constant=11.0, **loss_normalizers(mask))
    cuts = sorted(data.draw(st.lists(st.integers(0, loss.shape[0]), max_size=3)))
    parts = [slice(a, b) for a, b in zip([0] + cuts, cuts + [loss.shape[0]])]
    counts = {k: sum(loss_normalizers(mask[p])[k] for p in parts) for k in UNIT}
    assert counts == loss_normalizers(mask)
    total = sum(aggregate(loss[p], mask[p], mode, constant=11.0, **UNIT) for p in parts)
    assert torch.allclose(total / normalizer(mode, **counts), whole)


def test_normalizer_hand_example():
    counts = {"num_tokens": 4.0, "num_seqs": 2.0}
    assert normalizer("token_mean", **counts) == 4.0 and normalizer("seq_mean_token_mean", **counts) == 2.0
    assert normalizer("seq_sum_constant", **counts) == 2.0  # the constant stays inside aggregate
    assert normalizer("token_mean", num_tokens=0.0, num_seqs=0.0) == 1.0  # as aggregate's max(., 1)
    with pytest.raises(ConfigError, match="token-mean"):
        normalizer("token-mean", **counts)


@FAST
@given(token_tensors())
def test_token_mean_and_seq_mean_differ_as_defined(t):
    loss, _, _, mask = t
    norm = loss_normalizers(mask)
    on = mask > 0
    tm = (loss * mask).sum() / max(on.sum(), 1)
    rows = on.any(1)
    sm = ((loss * mask).sum(1)[rows] / on.sum(1)[rows]).mean() if rows.any() else torch.tensor(0.0)
    assert torch.allclose(aggregate(loss, mask, "token_mean", **norm), tm.to(loss.dtype))
    assert torch.allclose(aggregate(loss, mask, "seq_mean_token_mean", **norm), sm.to(loss.dtype))
    if len(set(on.sum(1)[rows].tolist())) == 1:  # equal lengths: the two coincide
        assert torch.allclose(tm.to(loss.dtype), sm.to(loss.dtype))
