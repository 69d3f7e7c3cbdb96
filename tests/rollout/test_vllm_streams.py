"""The weight stream GPT-OSS's in-place reload takes: fused experts one expert at a time under vLLM's per-expert
names, attention sinks held aside, everything else as it was. (The engine end to end, sampler against learner
after pushes of every weight, of the sinks alone and of the experts alone: tests/models/test_families.py.)"""
from __future__ import annotations

import torch

from upslope.rollout.vllm_streams import PerExpertStream, stream_for


def test_fused_experts_go_one_expert_at_a_time_and_the_sinks_wait():
    gate_up, down_bias = torch.randn(3, 4, 10), torch.randn(3, 4)
    sinks, q = torch.randn(2), torch.randn(4, 4)
    stream = PerExpertStream()
    out = list(stream([("model.layers.1.mlp.experts.gate_up_proj", gate_up), ("model.layers.1.self_attn.sinks", sinks),
                       ("model.layers.1.mlp.experts.down_proj_bias", down_bias),
                       ("model.layers.1.self_attn.q_proj.weight", q)]))
    names = [name for name, _ in out]
    assert names == [*(f"model.layers.1.mlp.experts.{e}.gate_up_proj" for e in range(3)),
                     *(f"model.layers.1.mlp.experts.{e}.down_proj_bias" for e in range(3)),
                     "model.layers.1.self_attn.q_proj.weight"]
    for e in range(3):
        assert torch.equal(out[e][1], gate_up[e]) and out[e][1].data_ptr() == gate_up[e].data_ptr()  # a view
        assert torch.equal(out[3 + e][1], down_bias[e])
    assert out[-1][1] is q
    assert [name for name, _ in stream.aside] == ["model.layers.1.self_attn.sinks"]
    assert torch.equal(stream.aside[0][1], sinks)
    list(stream([]))  # a new push starts with nothing held aside
    assert stream.aside == []


def test_only_gpt_oss_gets_a_stream():
    assert isinstance(stream_for("GptOssForCausalLM"), PerExpertStream)
    assert stream_for("Qwen3MoeForCausalLM") is None and stream_for(None) is None
