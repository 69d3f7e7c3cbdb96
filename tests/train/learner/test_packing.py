"""Padding-free packed micro-batches (train.packing): the same update as the padded forward, a token
budget counting real tokens, the model's own attention details kept (soft-capping where its
implementation applies it, Llama 4's attention chunks), and a model whose layers do not pass the plan
refused in one line.
(Every family's log-probs and gradients in the packed modes: tests/models/test_families.py.)"""
from __future__ import annotations

import logging

import pytest
import torch

from upslope.batch import Batch, build_batch, group_micro_batch_indices, micro_batch_indices
from upslope.config import load_config
from upslope.train.learner import packing
from upslope.train.learner.logprobs import token_scores
from upslope.train.learner.objectives import RLObjective
from upslope.train.learner.updater import Updater

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def mixed_batch(seed: int = 0) -> Batch:
    """Three groups of four: in each, one long completion (40-56 tokens) and three short ones (3-6)."""
    gen = torch.Generator().manual_seed(seed)
    prompts, comps, gids = [], [], []
    for g in range(3):
        prompt = torch.randint(5, 400, (6 + 3 * g,), generator=gen).tolist()
        for i in range(4):
            size = 40 + 8 * g if i == 0 else 3 + i + g % 2
            prompts.append(prompt)
            comps.append(torch.randint(5, 400, (size,), generator=gen).tolist())
            gids.append(g)
    b = build_batch(prompts, comps, [[-1.0] * len(c) for c in comps], gids, [False] * len(comps), pad_id=0)
    adv = torch.randn(len(comps), generator=gen)
    b.advantages = adv[:, None] * b.loss_mask
    return b


def learner(path: str, packed: bool | str, *extra: str) -> tuple[Updater, RLObjective]:
    """A learner on the tiny model; AdamW's eps keeps a rounding-size gradient from becoming a full step."""
    cfg = load_config(None, [f"model.name={path}", "train.precision=float32", "optim.lr=1e-3", "optim.eps=1e-4",
                             "train.micro_batch_tokens=128", f"train.packing={str(packed).lower()}", *extra])
    torch.manual_seed(0)
    updater = Updater.from_config(cfg, path, "cpu")
    return updater, RLObjective.from_config(cfg)


@pytest.mark.parametrize("extra", [["train.share_prompt=true"], ["train.share_prompt=false"],
                                   ["train.share_prompt=true", "train.grad_checkpointing=true"]],
                         ids=["shared_prompt", "rows", "checkpointed"])
def test_packed_update_equals_the_padded_one(tiny_model_path, extra):
    """One optimiser step on a batch of mixed lengths: the loss, every gradient and the weights after
    the step agree with the padded forward's, while the packed micro-batches forward fewer tokens."""
    padded, packed = learner(tiny_model_path, False, *extra), learner(tiny_model_path, True, *extra)
    grads: list[list[torch.Tensor]] = []
    for upd, _ in (padded, packed):
        upd.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: grads.append([p.grad.clone() for g in opt.param_groups for p in g["params"]]))
    b = mixed_batch()
    m_padded = padded[0].update(b, 1, padded[1])
    m_packed = packed[0].update(b, 1, packed[1])
    assert m_packed["loss"] == pytest.approx(m_padded["loss"], abs=1e-6)
    for a, c in zip(*grads):
        torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-7)
    for (name, a), c in zip(padded[0].model.named_parameters(), packed[0].model.parameters()):
        torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-6, msg=name)
    padded_cost = sum(len(idx) * int(b.seq_lens[idx].max()) for idx in padded[0].micro_batches(b))
    packed_cost = sum(int(b.seq_lens[idx].sum()) for idx in packed[0].micro_batches(b))
    assert packed_cost < padded_cost


def test_auto_packs_the_micro_batches_that_padding_would_fill(tiny_model_path):
    """train.packing=auto (the default) packs a micro-batch whose padding would fill a quarter or more of its
    slots and pads one without, and its update is the padded one's."""
    assert load_config(None, []).train.packing == "auto"
    auto, objective = learner(tiny_model_path, "auto", "train.share_prompt=true")
    one_group = mixed_batch().select([0, 1, 2, 3])  # prompt 6, completions 40, 4, 5, 6: 61 tokens, 6 + 4 x 40 slots
    assert (auto.forwarded_tokens(one_group), auto.padded_slots(one_group)) == (61, 166)
    assert auto.packs(one_group)
    prompt = list(range(5, 11))
    uniform = build_batch([prompt] * 4, [list(range(20, 28))] * 4, [[-1.0] * 8] * 4, [0] * 4, [False] * 4, pad_id=0)
    assert (auto.forwarded_tokens(uniform), auto.padded_slots(uniform)) == (38, 38)
    assert not auto.packs(uniform)
    padded, padded_objective = learner(tiny_model_path, False, "train.share_prompt=true")
    b = mixed_batch()
    assert auto.update(b, 1, objective)["loss"] == pytest.approx(padded.update(b, 1, padded_objective)["loss"],
                                                                abs=1e-6)


def test_the_packed_budget_counts_real_tokens():
    seq = torch.tensor([50, 10, 10, 10, 40])
    # padded: rows sorted longest first, rows x longest <= 60: [50], [40], [10, 10, 10]
    assert micro_batch_indices(seq, 60) == [[0], [4], [1, 2, 3]]
    # packed: their own tokens <= 60: 50 + 10, then 40 + 10 + 10
    assert micro_batch_indices(seq, 60, packed=True) == [[0, 1], [4, 2, 3]]
    prompts, groups = torch.tensor([5, 5, 5, 8, 8]), torch.tensor([0, 0, 0, 1, 1])
    seq = torch.tensor([45, 10, 10, 20, 20])  # group 0: completions 40, 5, 5; group 1: 12, 12
    # padded cost: groups x longest prompt + rows x longest completion: group 0 alone is 5 + 3 x 40 = 125
    assert group_micro_batch_indices(prompts, seq, groups, 125) == [[0, 1, 2], [3, 4]]
    # packed: 5 + 50 for group 0, 8 + 24 for group 1: 87 together
    assert group_micro_batch_indices(prompts, seq, groups, 87, packed=True) == [[0, 1, 2, 3, 4]]
    # an oversized group split by real tokens: 5 + 40, then 5 + 5 + 5
    assert group_micro_batch_indices(prompts[:3], seq[:3], groups[:3], 46, packed=True) == [[0], [1, 2]]


def test_packed_attention_soft_caps_where_the_models_implementation_does(smollm_path, tmp_path):
    """Gemma 2 under its eager attention soft-caps the attention logits (sdpa does not): the packed
    forward follows the implementation it wraps, with a cap small enough to act."""
    from upslope.families import make_family_model
    from upslope.models import load_model

    model = load_model(make_family_model("gemma2", smollm_path, tmp_path / "gemma2"), "float32").eval()
    model.config.attn_logit_softcapping = 0.5
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = 0.5
    b = mixed_batch(1)
    shared = (b.prompt_lens, b.seq_lens, b.group_ids)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        sdpa = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask).logprobs
        packed_sdpa = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask, shared=shared, packed=True)
        model.set_attn_implementation("eager")
        eager = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask).logprobs
        packed_eager = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask, shared=shared, packed=True)
    assert float((eager - sdpa).abs().max()) > 1e-2  # the cap acts
    torch.testing.assert_close(packed_sdpa.logprobs, sdpa, rtol=0, atol=5e-5)
    torch.testing.assert_close(packed_eager.logprobs, eager, rtol=0, atol=5e-5)


def test_layers_that_drop_the_plan_are_refused_in_one_line(tiny_model_path, caplog):
    """A model whose decoder layers do not hand attention keywords down (as some remote-code models do)
    would attend across rows: the packed forward notices, says so once, and pads instead."""
    from upslope.models import load_model

    model = load_model(tiny_model_path, "float32").eval()
    for layer in model.model.layers:
        def forward(*args, _own=layer.forward, **kwargs):
            kwargs.pop(packing.PLAN_KEY, None)
            return _own(*args, **kwargs)
        layer.forward = forward
    b = mixed_batch(2)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="upslope"):
        padded = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask).logprobs
        first = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask, packed=True).logprobs
        again = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask, packed=True).logprobs
    torch.testing.assert_close(first, padded)
    torch.testing.assert_close(again, padded)
    lines = [r.getMessage() for r in caplog.records if "train.packing" in r.getMessage()]
    assert len(lines) == 1 and "do not pass attention keywords" in lines[0] and "\n" not in lines[0]


def test_a_chunked_attention_mask_keeps_each_token_in_its_own_chunk_of_the_row():
    """Chunks of 3 over a row whose 2-token shared prompt is a prefix: positions 0-2, 3-5, 6-...; a query sees
    the keys of its own chunk up to itself (prefix keys included where they are in its chunk)."""
    plan = packing.PackPlan([packing.Block(2, 7, prefix_start=0, prefix_end=2)])
    mask = plan.mask(plan.blocks[0], None, torch.device("cpu"), chunk=3)
    want = torch.tensor([  # rows: the block's own positions 2..6; columns: keys at positions 0..6
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask, want)
    window = plan.mask(plan.blocks[0], 2, torch.device("cpu"), chunk=3)  # a window narrows it further
    assert torch.equal(window, want & ~torch.tensor([[1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0],
                                                      [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0],
                                                      [0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool))


def test_llama4_packed_rows_attend_within_their_chunks(smollm_path, tmp_path):
    """Llama 4's chunked layers (16-token chunks here, rows of up to 62 tokens): packed, as padded, each token
    attends within its own chunk of its row."""
    from upslope.families import make_family_model
    from upslope.models import load_model

    model = load_model(make_family_model("llama4", smollm_path, tmp_path / "llama4"), "float32").eval()
    model.config.attention_chunk_size = 16  # (the family's 128 would not act on these rows)
    b = mixed_batch(3)
    shared = (b.prompt_lens, b.seq_lens, b.group_ids)
    with torch.no_grad():
        padded = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask).logprobs
        for share in (None, shared):
            packed = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask, shared=share, packed=True)
            torch.testing.assert_close(packed.logprobs, padded, rtol=0, atol=5e-5)
