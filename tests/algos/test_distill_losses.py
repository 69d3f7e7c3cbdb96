"""Distillation losses against a direct KL / cross-entropy computed with full softmaxes on a
small vocabulary, a hand-computed top-k example, the sampled estimator's expected value and
expected gradient (enumerated exactly), and hypothesis properties."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from upslope.algos.aggregate import aggregate, loss_normalizers
from upslope.algos.distill import (DistillInputs, distill_metrics, forward_ce, mix, sampled_rkl, topk_rkl)
from upslope.errors import ConfigError
from upslope.registry import DISTILL_LOSSES

LOGIT = st.floats(-4, 4, allow_nan=False, width=32)


def inputs(s_logits: torch.Tensor, t_logits: torch.Tensor, k: int, sampled: torch.Tensor | None = None,
           mask: torch.Tensor | None = None, old: torch.Tensor | None = None) -> DistillInputs:
    """DistillInputs as the trainer builds them, from full [N, L, V] logits: log-probs of the
    sampled tokens and of the teacher's top-k tokens (student's full-vocab normalised)."""
    ls, lt = torch.log_softmax(s_logits, -1), torch.log_softmax(t_logits, -1)
    sampled = ls.argmax(-1) if sampled is None else sampled
    ids = lt.topk(k, -1).indices
    mask = torch.ones(ls.shape[:2]) if mask is None else mask
    take = lambda x, i: x.gather(-1, i)  # noqa: E731
    return DistillInputs(take(ls, sampled[..., None])[..., 0], take(lt, sampled[..., None])[..., 0], mask,
                         take(ls, ids), take(lt, ids), old)


def full_rkl(s_logits: torch.Tensor, t_logits: torch.Tensor) -> torch.Tensor:
    ls, lt = torch.log_softmax(s_logits, -1), torch.log_softmax(t_logits, -1)
    return (ls.exp() * (ls - lt)).sum(-1)


def full_ce(s_logits: torch.Tensor, t_logits: torch.Tensor) -> torch.Tensor:
    return -(torch.softmax(t_logits, -1) * torch.log_softmax(s_logits, -1)).sum(-1)


@st.composite
def logit_pairs(draw, max_vocab: int = 8):
    """(student logits, teacher logits) of shape [N, L, V], V >= 2, in float64."""
    n, length, vocab = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(2, max_vocab))
    size = n * length * vocab
    s = torch.tensor(draw(st.lists(LOGIT, min_size=size, max_size=size)), dtype=torch.float64)
    t = torch.tensor(draw(st.lists(LOGIT, min_size=size, max_size=size)), dtype=torch.float64)
    return s.view(n, length, vocab), t.view(n, length, vocab)


@settings(max_examples=60, deadline=None)
@given(logit_pairs())
def test_topk_losses_with_the_full_vocabulary_are_the_exact_kl_and_ce(pair):
    """k = V: topk_rkl is KL(p_s || p_t), forward_ce is the cross-entropy H(p_t, p_s), and the
    forward-KL metric is KL(p_t || p_s), all from full softmaxes."""
    s, t = pair
    x = inputs(s, t, k=s.shape[-1])
    assert torch.allclose(topk_rkl(x)[0], full_rkl(s, t), atol=1e-9)
    assert torch.allclose(forward_ce(x)[0], full_ce(s, t), atol=1e-9)
    m = distill_metrics(x)
    assert math.isclose(float(m["distill/rkl_topk"]), float(full_rkl(s, t).mean()), abs_tol=1e-9)
    assert math.isclose(float(m["distill/fkl_topk"]), float(full_rkl(t, s).mean()), abs_tol=1e-9)


def test_topk_by_hand():
    """V = 3, k = 2: p_s = (.5, .3, .2), p_t = (.6, .1, .3); the teacher's top-2 are tokens 0 and 2:
    p_t|S = (2/3, 1/3), p_s|S = (5/7, 2/7)."""
    s = torch.tensor([0.5, 0.3, 0.2]).log().view(1, 1, 3)
    t = torch.tensor([0.6, 0.1, 0.3]).log().view(1, 1, 3)
    x = inputs(s, t, k=2)
    rkl = 5 / 7 * math.log((5 / 7) / (2 / 3)) + 2 / 7 * math.log((2 / 7) / (1 / 3))
    ce = -(2 / 3 * math.log(0.5) + 1 / 3 * math.log(0.2))
    assert math.isclose(float(topk_rkl(x)[0]), rkl, rel_tol=1e-5)
    assert math.isclose(float(forward_ce(x)[0]), ce, rel_tol=1e-5)
    fkl = 2 / 3 * math.log((2 / 3) / 0.5) + 1 / 3 * math.log((1 / 3) / 0.2)  # KL(p_t|S || p_s)
    assert math.isclose(float(distill_metrics(x)["distill/fkl_topk"]), fkl, rel_tol=1e-5)


@settings(max_examples=60, deadline=None)
@given(logit_pairs(), st.integers(1, 8))
def test_topk_properties(pair, k):
    """For any k: reverse KL >= 0 and 0 when the student equals the teacher; forward CE >= the
    teacher's top-k entropy (forward KL >= 0), with equality when the student is the teacher
    truncated to its top-k (mass outside S is penalised); masked positions contribute nothing."""
    s, t = pair
    k = min(k, s.shape[-1])
    x = inputs(s, t, k)
    assert (topk_rkl(x)[0] >= -1e-12).all()
    assert float(distill_metrics(x)["distill/fkl_topk"]) >= -1e-12
    same = inputs(t, t, k)
    assert topk_rkl(same)[0].abs().max() < 1e-12
    top = torch.log_softmax(t, -1).topk(k, -1).indices  # the ids `inputs` takes (ties broken alike)
    in_topk = torch.zeros_like(t, dtype=torch.bool).scatter(-1, top, True)
    truncated = inputs(torch.where(in_topk, t, torch.full_like(t, -math.inf)), t, k)
    assert abs(float(distill_metrics(truncated)["distill/fkl_topk"])) < 1e-12
    mask = torch.zeros(s.shape[:2])
    mask[0, 0] = 1
    masked = inputs(s, t, k, mask=mask)
    for fn in (topk_rkl, forward_ce, sampled_rkl):
        loss = fn(masked)[0]
        assert (loss[mask == 0] == 0).all()
        assert loss[0, 0] == fn(x)[0][0, 0]


def enumerate_sampled(s_logits: torch.Tensor, t_logits: torch.Tensor,
                      behaviour: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """E_{x ~ q}[loss(x)] and E_{x ~ q}[grad loss(x)] (w.r.t. the student logits) of sampled_rkl at one
    position of vocabulary V, exactly, by enumerating every token x; q is the student itself
    (on-policy) or `behaviour` logits, an older student (its log-probs passed as old_logprobs)."""
    vocab = s_logits.shape[-1]
    q = torch.softmax(s_logits if behaviour is None else behaviour, -1).detach()
    value, grad = torch.zeros((), dtype=s_logits.dtype), torch.zeros_like(s_logits)
    for token in range(vocab):
        theta = s_logits.clone().requires_grad_(True)
        sampled = torch.tensor([[token]])
        old = None if behaviour is None else torch.log_softmax(behaviour, -1)[token].view(1, 1)
        x = inputs(theta.view(1, 1, vocab), t_logits.view(1, 1, vocab), k=1, sampled=sampled, old=old)
        loss = sampled_rkl(x)[0].sum()
        (g,) = torch.autograd.grad(loss, theta)
        value, grad = value + q[token] * loss.detach(), grad + q[token] * g
    return value, grad


def exact_rkl_grad(s_logits: torch.Tensor, t_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    theta = s_logits.clone().requires_grad_(True)
    kl = full_rkl(theta, t_logits)
    (g,) = torch.autograd.grad(kl, theta)
    return kl.detach(), g


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: st.tuples(st.lists(LOGIT, min_size=v, max_size=v),
                                                     st.lists(LOGIT, min_size=v, max_size=v),
                                                     st.lists(LOGIT, min_size=v, max_size=v))))
def test_sampled_rkl_is_unbiased_for_the_reverse_kl_and_its_gradient(vectors):
    """x ~ p_s: E[loss] = KL(p_s || p_t) and E[grad loss] = grad KL(p_s || p_t), exactly; the same
    holds with samples of an older student q when its log-probs are given (importance ratio)."""
    s, t, b = (torch.tensor(v, dtype=torch.float64) for v in vectors)
    kl, want = exact_rkl_grad(s, t)
    value, grad = enumerate_sampled(s, t)
    assert torch.isclose(value, kl, atol=1e-9)
    assert torch.allclose(grad, want, atol=1e-9)
    _, grad_off = enumerate_sampled(s, t, behaviour=b)
    assert torch.allclose(grad_off, want, atol=1e-9)


def test_sampled_rkl_monte_carlo_gradient_on_a_tiny_vocabulary():
    """The same with actual samples: the mean gradient over 20000 draws of a 5-token student is
    within Monte Carlo error of the exact reverse-KL gradient (and the tokens' log-ratio's mean
    is the KL)."""
    gen = torch.Generator().manual_seed(0)
    s = torch.tensor([1.0, 0.2, -0.5, 0.7, -1.2], dtype=torch.float64)
    t = torch.tensor([-0.3, 1.1, 0.4, -0.8, 0.9], dtype=torch.float64)
    kl, want = exact_rkl_grad(s, t)
    draws = 20_000
    sampled = torch.multinomial(torch.softmax(s, -1), draws, replacement=True, generator=gen).view(1, draws)
    theta = s.clone().requires_grad_(True)
    x = inputs(theta.expand(1, draws, 5), t.expand(1, draws, 5), k=1, sampled=sampled)
    loss = sampled_rkl(x)[0]
    (grad,) = torch.autograd.grad(loss.mean(), theta)
    assert abs(float(loss.detach().mean()) - float(kl)) < 0.03
    assert (grad - want).abs().max() < 0.03, (grad, want)


def test_sampled_rkl_zero_when_student_is_teacher():
    s = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    x = inputs(s, s.detach(), k=3, sampled=torch.randint(0, 7, (2, 3)))
    loss = sampled_rkl(x)[0]
    assert loss.abs().max() == 0
    (g,) = torch.autograd.grad(loss.sum(), s)
    assert g.abs().max() == 0
    assert float(distill_metrics(x)["kl"]) == 0


@settings(max_examples=30, deadline=None)
@given(logit_pairs(), st.floats(0, 2), st.floats(0, 2), st.floats(0.01, 2))
def test_mix_is_the_weighted_sum(pair, w_sampled, w_rkl, w_ce):
    s, t = pair
    x = inputs(s, t, k=min(3, s.shape[-1]), sampled=torch.zeros(s.shape[:2], dtype=torch.long))
    got, metrics = mix(x, sampled_rkl=w_sampled, topk_rkl=w_rkl, forward_ce=w_ce)
    want = w_sampled * sampled_rkl(x)[0] + w_rkl * topk_rkl(x)[0] + w_ce * forward_ce(x)[0]
    assert torch.allclose(got, want, atol=1e-9)
    assert "distill/forward_ce" in metrics


def test_mix_options_are_checked():
    bound = DISTILL_LOSSES.bind("mix", {"topk_rkl": 1, "forward_ce": 0}, where="distill.loss.options")
    s, t = torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    assert torch.allclose(bound(inputs(s, t, 5))[0], full_rkl(s, t), atol=1e-6)
    with pytest.raises(ConfigError, match="distill.loss.options.reverse: unknown option"):
        DISTILL_LOSSES.bind("mix", {"reverse": 1.0}, where="distill.loss.options")
    with pytest.raises(ConfigError, match="not all 0"):
        mix(inputs(s, t, 5), sampled_rkl=0, topk_rkl=0, forward_ce=0)
    with pytest.raises(ConfigError, match="unknown distill_loss 'topk_kl'.*did you mean 'topk_rkl'"):
        DISTILL_LOSSES.get("topk_kl", "distill.loss.name")


def test_topk_losses_need_the_teacher_topk():
    x = DistillInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ConfigError, match="top-k"):
        topk_rkl(x)


def test_aggregated_loss_splits_over_micro_batches():
    """Summed over micro-batches with the mini-batch's normalisers, the loss is the whole batch's."""
    s, t = torch.randn(4, 5, 6, dtype=torch.float64), torch.randn(4, 5, 6, dtype=torch.float64)
    mask = (torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) > 0.3).double()
    norms = loss_normalizers(mask)
    whole = aggregate(topk_rkl(inputs(s, t, 4, mask=mask))[0], mask, "seq_mean_token_mean", **norms)
    parts = sum(aggregate(topk_rkl(inputs(s[i:i + 2], t[i:i + 2], 4, mask=mask[i:i + 2]))[0], mask[i:i + 2],
                          "seq_mean_token_mean", **norms) for i in (0, 2))
    assert torch.isclose(whole, parts)
