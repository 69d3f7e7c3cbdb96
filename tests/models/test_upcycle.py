"""Sparse upcycling (upslope.upcycle) of the tiny Llama: with no noise the Mixtral MoE computes the dense
model (its experts are copies and its router's top-k weights sum to 1); with noise the experts differ and
the saved directory loads as a MoE whose routers replay and balance like any other."""
from __future__ import annotations

import pytest
import torch

from upslope import routing
from upslope.models import load_model, load_tokenizer
from upslope.upcycle import upcycle, upcycle_directory

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def logprobs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), -1)


def test_without_noise_the_moe_is_the_dense_model(tiny_model_path):
    dense = load_model(tiny_model_path, "float32").eval()
    moe = upcycle(dense, experts=4, top_k=2, noise=0.0).eval()
    ids = torch.randint(3, 30_000, (2, 24), generator=torch.Generator().manual_seed(0))
    assert type(moe).__name__ == "MixtralForCausalLM" and len(routing.routers(moe)) == dense.config.num_hidden_layers
    assert float((logprobs(moe, ids) - logprobs(dense, ids)).abs().max()) < 1e-5
    noisy = upcycle(dense, experts=4, top_k=2, noise=0.1).eval()
    assert float((logprobs(noisy, ids) - logprobs(dense, ids)).abs().max()) > 1e-3  # the experts differ
    experts = noisy.model.layers[0].mlp.experts.gate_up_proj.detach()
    assert float((experts[0] - experts[1]).abs().max()) > 0


def test_an_upcycled_directory_loads_as_a_moe_with_its_tokenizer(tiny_model_path, tmp_path):
    path = upcycle_directory(tiny_model_path, tmp_path / "moe", experts=4, top_k=2, noise=0.05)
    moe = load_model(path, "float32")
    assert routing.why_not_routed(moe) is None and routing.expert_counts(moe) == (4, 2)
    assert load_tokenizer(path).encode("7 times 8") == load_tokenizer(tiny_model_path).encode("7 times 8")


def test_only_a_llama_without_biases_is_upcycled(smollm_path, tmp_path):
    from upslope.families import make_family_model

    qwen2 = load_model(make_family_model("qwen2", smollm_path, tmp_path / "qwen2"), "float32")
    with pytest.raises(ValueError, match="upcycling takes a Llama model without biases, not qwen2"):
        upcycle(qwen2)
