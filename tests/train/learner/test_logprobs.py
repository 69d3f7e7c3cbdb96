"""The learner's log-prob paths agree with a direct full-logits computation, and the
shared-prompt path gives the same values and gradients as the per-row path."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from upslope.batch import build_batch, group_micro_batch_indices, micro_batch_indices
from upslope.models import load_model
from upslope.train.learner.logprobs import token_logprobs, token_logprobs_shared_prompt


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    torch.manual_seed(0)
    return load_model(tiny_model_path, "float32")


def make_batch(groups: int = 3, n: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts, comps, gids = [], [], []
    for gi in range(groups):
        p = torch.randint(5, 2000, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n):
            c = torch.randint(5, 2000, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
            prompts.append(p)
            comps.append(c)
            gids.append(gi)
    lps = [[0.0] * len(c) for c in comps]
    return build_batch(prompts, comps, lps, gids, [False] * len(comps), pad_id=2)


def direct_logprobs(model, b):
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits.float()
    lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, b.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros(b.size, 1), lp], 1) * b.loss_mask


def test_chunked_logprobs_match_full_logits(tiny):
    b = make_batch()
    with torch.no_grad():
        ref = direct_logprobs(tiny, b)
        lp, ent = token_logprobs(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=5)
    assert torch.allclose(lp, ref, atol=1e-5)
    assert (ent[b.loss_mask > 0] > 0).all() and (ent[b.loss_mask == 0] == 0).all()


def test_shared_prompt_path_matches_values_and_gradients(tiny):
    b = make_batch(seed=1)
    lp_a, ent_a = token_logprobs(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=7)
    (lp_a * torch.linspace(0.5, 1.5, lp_a.numel()).view_as(lp_a)).sum().backward()
    grads_a = {k: p.grad.clone() for k, p in tiny.named_parameters()}
    tiny.zero_grad()
    lp_b, ent_b = token_logprobs_shared_prompt(tiny, b.input_ids, b.attention_mask, b.loss_mask, b.prompt_lens,
                                               b.seq_lens, b.group_ids, chunk_rows=7)
    (lp_b * torch.linspace(0.5, 1.5, lp_b.numel()).view_as(lp_b)).sum().backward()
    assert torch.allclose(lp_a, lp_b, atol=2e-5)
    assert torch.allclose(ent_a, ent_b, atol=2e-4)
    for k, p in tiny.named_parameters():
        scale = grads_a[k].abs().max().clamp(min=1e-8)
        assert ((p.grad - grads_a[k]).abs().max() / scale) < 1e-3, k
    tiny.zero_grad()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 6)), min_size=1, max_size=12), st.integers(16, 200))
def test_micro_batches_cover_every_row_once_within_budget(spec, budget):
    prompt_lens, seq_lens, gids = [], [], []
    for gi, (plen, n) in enumerate(spec):
        for j in range(n):
            prompt_lens.append(plen)
            seq_lens.append(plen + 1 + (gi * 7 + j * 3) % 11)
            gids.append(gi)
    pl, sl, g = torch.tensor(prompt_lens), torch.tensor(seq_lens), torch.tensor(gids)
    for chunks in (micro_batch_indices(sl, budget), group_micro_batch_indices(pl, sl, g, budget)):
        flat = sorted(i for c in chunks for i in c)
        assert flat == list(range(len(sl)))
    for c in micro_batch_indices(sl, budget):
        assert len(c) == 1 or len(c) * int(sl[c].max()) <= budget
    for c in group_micro_batch_indices(pl, sl, g, budget):
        ng = len(set(g[c].tolist()))
        cost = ng * int(pl[c].max()) + len(c) * int((sl - pl)[c].max())
        assert len(c) == 1 or cost <= budget or ng == 1


def test_hf_engine_sampled_logprobs_match_the_learner(tiny_model_path, tokenizer):
    """At temperature 1 with no top-k/top-p the engine's sampler log-probs are the learner's
    (HF's default top-k of 50 must not truncate the distribution silently)."""
    from upslope.engine import SamplingParams
    from upslope.rollout.hf import HFEngine

    engine = HFEngine(tiny_model_path, tokenizer, dtype="float32")
    prompts = [[1, 500, 600, 700], [1, 42, 43]]
    out = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=0))
    comps = [c for group in out for c in group]
    b = build_batch([p for p in prompts for _ in range(3)], [c.token_ids for c in comps],
                    [c.logprobs for c in comps], [0, 0, 0, 1, 1, 1], [c.truncated for c in comps], pad_id=2)
    with torch.no_grad():
        lp, _ = token_logprobs(engine.model, b.input_ids, b.attention_mask, b.loss_mask)
    assert ((lp - b.sampler_logprobs).abs() * b.loss_mask).max() < 1e-4


def direct_entropy(model, b):
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits.float()[:, :-1]
    logp = torch.log_softmax(logits, -1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.cat([torch.zeros(b.size, 1), ent], 1) * b.loss_mask


@pytest.mark.parametrize("shared", [False, True])
def test_entropy_gradient_matches_full_logits(tiny, shared):
    """With entropy_grad the chunked entropy carries the same gradient as the entropy of the full softmax
    (what an entropy bonus trains); without it the entropy is detached."""
    b = make_batch(seed=2)
    tiny.zero_grad()
    direct_entropy(tiny, b).sum().backward()
    want = {k: p.grad.clone() for k, p in tiny.named_parameters()}
    tiny.zero_grad()
    if shared:
        _, ent = token_logprobs_shared_prompt(tiny, b.input_ids, b.attention_mask, b.loss_mask, b.prompt_lens,
                                              b.seq_lens, b.group_ids, chunk_rows=5, entropy_grad=True)
    else:
        _, ent = token_logprobs(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=5, entropy_grad=True)
    ent.sum().backward()
    for k, p in tiny.named_parameters():
        assert torch.allclose(p.grad, want[k], atol=1e-4, rtol=1e-3), k
    tiny.zero_grad()
    _, ent = token_logprobs(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=5)
    assert not ent.requires_grad


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 50), st.integers(1, 17), st.sampled_from([1.0, 0.6, 1.5]),
       st.booleans(), st.integers(0, 10_000), st.sampled_from([1.0, 0.25, 4.0]), st.sampled_from([None, 1.5, 30.0]),
       st.sampled_from([(1.0, 0), (0.8, 0), (1.0, 3), (0.9, 5)]))
def test_fused_head_matches_autograd_in_float64(rows, vocab, chunk, temperature, with_bias, seed, scale, softcap,
                                                truncation):
    """The fused head's log-probs, entropy and its gradients wrt hidden states, weight and bias
    equal those of a full float64 log-softmax, for any chunking and temperature, through the
    families' head transforms (a logit scale as Cohere's and Granite's; soft-capping as Gemma 2/3's,
    a cap of 1.5 acting on every logit of these random heads), and under the sampler's truncation
    (top-p, top-k): the reference there is transformers' own top-k and top-p logits warpers, and the
    targets are tokens those warpers keep (what a sampler could have drawn)."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from upslope.train.learner.logprobs import HeadTransform, Truncation, _LinearLogprob

    transform, top_p, top_k = HeadTransform(scale, softcap), *truncation
    truncation = Truncation(top_p, top_k)

    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, 8, generator=gen, dtype=torch.float64)
    w = torch.randn(vocab, 8, generator=gen, dtype=torch.float64)
    b = torch.randn(vocab, generator=gen, dtype=torch.float64) if with_bias else None
    upstream = torch.randn(rows, generator=gen, dtype=torch.float64)

    def processed(h_, w_, b_=None):
        logits = (h_ @ w_.t() + (b_ if b_ is not None else 0)) * scale
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        logits = logits / temperature
        if top_k:
            logits = TopKLogitsWarper(top_k)(None, logits)
        if top_p < 1.0:
            logits = TopPLogitsWarper(top_p)(None, logits)
        return logits

    with torch.no_grad():  # a kept token per row, drawn at random
        kept = torch.isfinite(processed(h, w, b))
        targets = torch.multinomial(kept.double(), 1, generator=gen).squeeze(-1)

    def grads(fn):
        leaves = [x.clone().requires_grad_() for x in (h, w)] + ([b.clone().requires_grad_()] if with_bias else [])
        lp, ent = fn(*leaves)
        (lp * upstream).sum().backward()
        return [lp.detach(), ent.detach()] + [x.grad for x in leaves]

    def exact(h_, w_, b_=None):
        logp = torch.log_softmax(processed(h_, w_, b_), -1)
        return logp.gather(-1, targets[:, None]).squeeze(-1), -torch.where(logp.isfinite(), logp.exp() * logp, 0).sum(-1)

    def fused(h_, w_, b_=None):
        return _LinearLogprob.apply(h_, w_, b_, targets, temperature, chunk, transform, truncation)

    for ours, ref in zip(grads(fused), grads(exact)):
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("shared", [True, False], ids=["shared_prompt", "rows"])
def test_checkpointed_layers_give_the_same_values_and_gradients(tiny, shared):
    """Per-layer activation checkpointing (which keeps the shared prompt's KV cache) changes no
    log-prob and no gradient, and leaves the layers as they were."""
    from upslope.train.learner.logprobs import token_scores

    b = make_batch(seed=2)
    weights = torch.linspace(0.5, 1.5, b.input_ids.numel()).view_as(b.input_ids)
    out = []
    for ckpt in (False, True):
        tiny.zero_grad()
        lp = token_scores(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=7, checkpoint_layers=ckpt,
                          shared=(b.prompt_lens, b.seq_lens, b.group_ids) if shared else None).logprobs
        (lp * weights).sum().backward()
        out.append((lp.detach(), {k: p.grad.clone() for k, p in tiny.named_parameters()}))
    tiny.zero_grad()
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=0)
    for k, g in out[0][1].items():
        torch.testing.assert_close(out[1][1][k], g, rtol=1e-5, atol=1e-7, msg=k)
    assert all("forward" not in layer.__dict__ for layer in tiny.model.layers)


def test_checkpointed_layers_recompute_in_backward(tiny):
    """The layers really run twice with checkpointing (forward, then again in backward)."""
    from upslope.train.learner.logprobs import token_scores

    b = make_batch(seed=3)
    calls = []
    hook = tiny.model.layers[0].mlp.register_forward_pre_hook(lambda m, i: calls.append(1))
    try:
        for ckpt in (False, True):
            calls.clear()
            lp = token_scores(tiny, b.input_ids, b.attention_mask, b.loss_mask, checkpoint_layers=ckpt,
                              shared=(b.prompt_lens, b.seq_lens, b.group_ids)).logprobs
            lp.sum().backward()
            assert len(calls) == (3 if ckpt else 2)  # prompt pass + completion pass (+ its recompute)
    finally:
        hook.remove()
        tiny.zero_grad()
