"""The chunked LM head's distillation outputs (log-probs at given ids, the model's own top-k)
against full [B, T, V] logits of the real tiny model, per-row and shared-prompt, values and
gradients; and the Learner's micro-batched no-grad scoring of a whole batch."""
from __future__ import annotations

import pytest
import torch

from upslope.batch import build_batch
from upslope.config import load_config
from upslope.models import load_model
from upslope.train.learner.updater import Updater
from upslope.train.learner.logprobs import token_logprobs, token_scores

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return load_model(tiny_model_path, "float32")


def make_batch(seed: int = 0, groups: int = 3, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    prompts, comps, gids = [], [], []
    for gi in range(groups):
        p = torch.randint(5, 2000, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n):
            comps.append(torch.randint(5, 2000, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist())
            prompts.append(p)
            gids.append(gi)
    return build_batch(prompts, comps, [[0.0] * len(c) for c in comps], gids, [False] * len(comps), pad_id=2)


def full_logprobs(model, b, temperature: float = TEMPERATURE) -> torch.Tensor:
    """[N, L, V] log-softmax of the full logits, aligned to the token they predict (row t: token t)."""
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits.float() / temperature
    lp = torch.log_softmax(logits, -1)[:, :-1]
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], 1)


def random_ids(b, k: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (*b.input_ids.shape, k), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shared", [False, True], ids=["rows", "shared_prompt"])
def test_gathered_and_topk_match_full_logits(tiny, shared):
    b = make_batch()
    vocab = tiny.get_output_embeddings().weight.shape[0]
    ids = random_ids(b, 5, vocab)
    kw = {"shared": (b.prompt_lens, b.seq_lens, b.group_ids)} if shared else {}
    with torch.no_grad():
        full = full_logprobs(tiny, b)
        out = token_scores(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=4, temperature=TEMPERATURE,
                           gather_ids=ids, top_k=6, **kw)
    m = b.loss_mask > 0
    assert torch.allclose(out.gathered[m], full.gather(-1, ids)[m], atol=1e-5)
    want_lp, want_ids = full.topk(6, -1)
    assert torch.equal(out.topk_ids[m], want_ids[m])
    assert torch.allclose(out.topk_logprobs[m], want_lp[m], atol=1e-5)
    assert torch.allclose(out.logprobs[m], full.gather(-1, b.input_ids[..., None])[..., 0][m], atol=1e-5)
    for t in (out.gathered, out.topk_logprobs, out.topk_ids):  # 0 off the target mask
        assert (t[~m] == 0).all()


def test_topk_within_a_vocabulary_prefix(tiny):
    """top_k_vocab: the top-k among the first ids only (a teacher whose padded head is larger)."""
    b = make_batch(seed=3)
    with torch.no_grad():
        full = full_logprobs(tiny, b, 1.0)
        out = token_scores(tiny, b.input_ids, b.attention_mask, b.loss_mask, top_k=4, top_k_vocab=300)
    m = b.loss_mask > 0
    assert (out.topk_ids[m] < 300).all()
    assert torch.equal(out.topk_ids[m], full[..., :300].topk(4, -1).indices[m])


@pytest.mark.parametrize("shared", [False, True], ids=["rows", "shared_prompt"])
def test_gathered_gradient_matches_full_logits(tiny, shared):
    b = make_batch(seed=1)
    vocab = tiny.get_output_embeddings().weight.shape[0]
    ids = random_ids(b, 4, vocab, seed=1)
    weights = torch.linspace(0.5, 1.5, ids.numel()).view(ids.shape) * b.loss_mask[..., None]
    tiny.zero_grad()
    (full_logprobs(tiny, b).gather(-1, ids) * weights).sum().backward()
    want = {k: p.grad.clone() for k, p in tiny.named_parameters()}
    tiny.zero_grad()
    kw = {"shared": (b.prompt_lens, b.seq_lens, b.group_ids)} if shared else {}
    out = token_scores(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=3, temperature=TEMPERATURE,
                       gather_ids=ids, **kw)
    (out.gathered * weights).sum().backward()
    for k, p in tiny.named_parameters():
        scale = want[k].abs().max().clamp(min=1e-8)
        assert ((p.grad - want[k]).abs().max() / scale) < 1e-3, k
    tiny.zero_grad()


def test_plain_logprobs_unchanged_by_the_extension(tiny):
    """token_logprobs (what RL trains with) returns the same as token_scores' log-probs."""
    b = make_batch(seed=2)
    with torch.no_grad():
        lp, ent = token_logprobs(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=5)
        out = token_scores(tiny, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=5,
                           gather_ids=random_ids(b, 2, 100), top_k=3)
    assert torch.equal(lp, out.logprobs) and torch.equal(ent, out.entropy)


def test_learner_score_over_micro_batches_matches_one_pass(tiny_model_path, tiny, tmp_path):
    """Learner.score (the teacher's scoring) in several token-budget micro-batches gives the
    full-logits values for every row, on rows in any order."""
    b = make_batch(seed=4, groups=4)
    cfg = load_config(None, [f"model.name={tiny_model_path}", f"run_dir={tmp_path}", "train.micro_batch_tokens=40",
                             "train.precision=float32"])
    learner = Updater.from_config(cfg, tiny_model_path, "cpu")
    assert len(learner.micro_batches(b)) > 1
    out = learner.score(b, tiny, temperature=TEMPERATURE, top_k=3)
    with torch.no_grad():
        full = full_logprobs(tiny, b)
    m = b.loss_mask > 0
    assert torch.allclose(out.logprobs[m], full.gather(-1, b.input_ids[..., None])[..., 0][m], atol=1e-5)
    assert torch.equal(out.topk_ids[m], full.topk(3, -1).indices[m])
    assert torch.allclose(out.topk_logprobs[m], full.topk(3, -1).values[m], atol=1e-5)
