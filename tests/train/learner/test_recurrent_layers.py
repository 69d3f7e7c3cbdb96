"""Hybrid models (recurrent layers beside attention: Falcon-H1's Mamba-2 mixers, LFM2's short convolutions,
Qwen3-Next's gated delta rule): the learner's shared-prompt and packed forwards rely on attention alone, so
for these it runs each row with its own prompt, padded, says so once per option in one line, and scores
what the model's own forward scores. (Every family's log-probs and gradients in every mode:
tests/models/test_families.py.)"""
from __future__ import annotations

import logging

import pytest
import torch

from upslope.batch import build_batch
from upslope.config import load_config
from upslope.families import make_family_model
from upslope.models import load_model
from upslope.train.learner.mixers import recurrent_layers
from upslope.train.learner.updater import Updater

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def family_path(smollm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrids")
    return lambda name: make_family_model(name, smollm_path, root / name)


@pytest.mark.parametrize("family, count", [("falcon_h1", 2), ("llama", 0),
                                           *(pytest.param(f, n, marks=pytest.mark.slow)
                                             for f, n in (("lfm2", 1), ("qwen3_next", 1), ("gpt_oss", 0)))])
def test_recurrent_layers_are_counted_from_the_config(family, count, family_path):
    model = load_model(family_path(family), empty=True)
    assert recurrent_layers(model) == count


def test_a_hybrid_scores_each_row_with_its_own_prompt_and_says_so_once(family_path, caplog):
    """Falcon-H1 with train.share_prompt and train.packing on: both set aside (one line each, once), and the
    learner's log-probs are those of the model's own forward over each row alone."""
    path = family_path("falcon_h1")
    cfg = load_config(None, [f"model.name={path}", "train.precision=float32", "train.share_prompt=true",
                             "train.packing=true", "train.micro_batch_tokens=256"])
    updater = Updater.from_config(cfg, path, "cpu")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 400, (n,), generator=gen).tolist() for n in (9, 9, 20, 20)]
    comps = [torch.randint(5, 400, (n,), generator=gen).tolist() for n in (30, 4, 12, 25)]
    b = build_batch(prompts, comps, [[-1.0] * len(c) for c in comps], [0, 0, 1, 1], [False] * 4, pad_id=0)
    with caplog.at_level(logging.WARNING, logger="upslope"):
        assert not updater.share_prompt
        got = updater.logprobs(b, temperature=1.0)
        again = updater.logprobs(b, temperature=1.0)
    model = updater.model.eval()
    with torch.no_grad():
        for row in range(4):
            ids = torch.tensor([prompts[row] + comps[row]])
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            start, end = len(prompts[row]), len(prompts[row]) + len(comps[row])
            torch.testing.assert_close(got[row, start:end], lp[start - 1:end - 1], rtol=0, atol=5e-5)
    torch.testing.assert_close(again, got)
    lines = [r.getMessage() for r in caplog.records if "recurrent layer" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line and "FalconH1ForCausalLM has 2 recurrent layers" in line
                                   for line in lines), lines
    assert lines[0].startswith("train.share_prompt:") and "each row runs its own prompt" in lines[0]
    assert any(line.startswith("train.packing:") and "padded micro-batches" in line for line in lines)
