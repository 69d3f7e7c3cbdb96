"""Token salience for FlowTracer, ARCA and GRAIL: attention flow and the salience weights against hand
computations, and each source on the tiny model through a real Updater (micro-batched, zero off the
trained tokens; ARCA's residual is 0 while the adapter is 0 and follows it once it moves)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.credit_salience import arca, flowtracer, grail, salience_weights
from upslope.batch import build_batch
from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.train.learner.salience import answer_region, flow_to_answer, token_salience
from upslope.train.learner.updater import Updater


def test_answer_region_is_each_rows_last_trained_tokens():
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 0, 0]])
    assert answer_region(mask, 2).long().tolist() == [[0, 0, 1, 1, 0], [0, 0, 1, 0, 0]]


def test_attention_flow_into_the_answer_by_hand():
    # 3 tokens, token 2 is the answer; it attends 0.25 to token 0, 0.75 to token 1; token 1 attends all to 0
    attn = torch.tensor([[[1.0, 0, 0], [1.0, 0, 0], [0.25, 0.75, 0]]])
    x = flow_to_answer(attn, torch.tensor([[False, False, True]]))
    assert x.tolist() == [[0.25 + 0.75 * 1.0, 0.75, 1.0]]  # token 0 receives directly and through token 1


def test_salience_weights_by_hand_and_the_advantage():
    mask = torch.tensor([[0.0, 1, 1, 1]])
    w = salience_weights(torch.tensor([[9.0, 1, 2, 3]]), mask, mix=0.5)
    assert w.tolist()[0] == pytest.approx([0.0, 0.5 + 0.5 * 0.5, 0.5 + 0.5 * 1.0, 0.5 + 0.5 * 1.5])
    assert salience_weights(torch.zeros(1, 4), mask, 1.0).tolist() == [[0.0, 1.0, 1.0, 1.0]]  # no salience: uniform
    b = build_batch([[7], [7]], [[5, 6], [5, 6]], [[-1.0, -1.0]] * 2, [0, 0], [False] * 2, pad_id=0)
    b.rewards = torch.tensor([1.0, 0.0])
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    got = flowtracer(b, torch.tensor([[0.0, 1.0, 3.0]] * 2), mix=1.0)
    assert got[:, 1:].tolist() == [pytest.approx([a * 0.5, a * 1.5], rel=1e-5), pytest.approx([-a * 0.5, -a * 1.5], rel=1e-5)]
    with pytest.raises(ConfigError):
        grail(b)  # outside the trainer nobody computed the salience


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=6), st.floats(0, 1))
def test_salience_weights_average_one_and_stay_non_negative(sal, mix):
    s = torch.tensor([[0.0, *sal]])
    mask = torch.tensor([[0.0] + [1.0] * len(sal)])
    w = salience_weights(s, mask, mix)
    assert float(w.sum()) == pytest.approx(len(sal), rel=1e-6) and bool((w >= 0).all())


def _learner(path, tmp_path, *extra):
    cfg = load_config(None, [f"model.name={path}", f"run_dir={tmp_path}", "train.micro_batch_tokens=16",
                             "train.precision=float32", *extra])
    return Updater.from_config(cfg, path, "cpu")


def _batch():
    b = build_batch([[11, 12, 13, 14, 15, 16]] * 2, [[21, 22, 23, 24, 25, 26], [31, 32, 33, 34]],
                    [[-1.0] * 6, [-1.0] * 4], [0, 1], [False] * 2, pad_id=0)
    b.rewards = torch.tensor([1.0, 0.0])
    return b


@pytest.mark.parametrize("source", ["attention_flow", "gradient"])
def test_sources_on_the_tiny_model_are_positive_on_trained_tokens_only(source, tiny_model_path, tmp_path):
    learner = _learner(tiny_model_path, tmp_path)
    b = _batch()
    assert len(learner.micro_batches(b)) == 2
    sal = token_salience(learner, b, source, answer_tokens=2)
    assert bool((sal[b.loss_mask == 0] == 0).all())
    inner = (b.loss_mask > 0) & ~answer_region(b.loss_mask, 1)  # a row's last token: nothing after it to explain
    assert bool((sal[inner] > 0).all())
    assert all(p.grad is None for p in learner.model.parameters())  # GRAIL touches no weight gradient
    assert learner.model.config._attn_implementation != "eager" or source != "attention_flow"


def test_arca_residual_is_zero_at_init_and_follows_the_adapter(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError, match="LoRA"):
        token_salience(_learner(tiny_model_path, tmp_path), _batch(), "adapter_residual", 3)
    learner = _learner(tiny_model_path, tmp_path, "lora.enabled=true")
    b = _batch()
    assert float(token_salience(learner, b, "adapter_residual", 3).abs().max()) == 0.0  # B = 0
    with torch.no_grad():
        for n, p in learner.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    sal = token_salience(learner, b, "adapter_residual", 3)
    assert bool((sal[b.loss_mask > 0] > 0).all()) and bool((sal[b.loss_mask == 0] == 0).all())
    assert arca(b, sal).shape == b.loss_mask.shape
