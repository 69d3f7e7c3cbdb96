"""Memory savers that must not change results: the lean RMSNorm and SwiGLU MLP, and returning
freed heap memory to the OS."""
from __future__ import annotations

import psutil
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from upslope.batch import build_batch
from upslope.models import load_model
from upslope.train.learner.logprobs import token_scores
from upslope.train.learner.memory import release_freed_memory, use_lean_activations


def compare_modules(ref: torch.nn.Module, lean: torch.nn.Module, x: torch.Tensor, autocast: bool,
                    tol: dict[str, float]) -> None:
    """Same output bit for bit, and input and parameter gradients within `tol`."""
    dy = torch.randn(x.shape).to(x.dtype)
    results = []
    for module in (ref, lean):
        xx = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = module(xx)
        (y.float() * dy.float()).sum().backward()
        results.append([y.detach(), xx.grad] + [p.grad for p in module.parameters()])
    assert torch.equal(results[1][0], results[0][0])  # the same forward arithmetic
    for ours, theirs in zip(results[1][1:], results[0][1:]):
        torch.testing.assert_close(ours, theirs, **tol)


@pytest.mark.parametrize("dtype,autocast", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)],
                         ids=["fp32", "bf16", "autocast"])
def test_lean_rmsnorm_matches_the_module_in_value_and_gradient(dtype, autocast):
    torch.manual_seed(0)
    ref = LlamaRMSNorm(32, eps=1e-5).to(dtype)
    ref.weight.data = torch.randn(32).to(dtype)
    lean = LlamaRMSNorm(32, eps=1e-5).to(dtype)
    lean.weight.data = ref.weight.data.clone()
    assert use_lean_activations(lean) == 1
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    compare_modules(ref, lean, torch.randn(4, 7, 32).to(dtype) * 3, autocast, tol)


@pytest.mark.parametrize("dtype,autocast,bias", [(torch.float32, False, False), (torch.bfloat16, False, False),
                                                (torch.float32, True, False), (torch.float32, False, True)],
                         ids=["fp32", "bf16", "autocast", "bias"])
def test_lean_swiglu_matches_the_module_in_value_and_gradient(dtype, autocast, bias):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=24, intermediate_size=40, num_attention_heads=4, num_key_value_heads=4,
                      hidden_act="silu", mlp_bias=bias)
    ref = LlamaMLP(cfg).to(dtype)
    lean = LlamaMLP(cfg).to(dtype)
    lean.load_state_dict(ref.state_dict())
    assert use_lean_activations(lean) == 1
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 and not autocast else dict(rtol=2e-2, atol=2e-2)
    compare_modules(ref, lean, torch.randn(3, 5, 24).to(dtype), autocast, tol)


def test_lean_layers_keep_the_models_log_probs_and_gradients(tiny_model_path):
    """On the tiny Llama-architecture model: every norm and MLP is swapped, and log-probs and
    weight gradients are the same as with HF's modules."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 2000, (6,), generator=gen).tolist() for _ in range(3)]
    comps = [torch.randint(5, 2000, (5,), generator=gen).tolist() for _ in range(3)]
    b = build_batch(prompts, comps, [[0.0] * 5] * 3, [0, 1, 2], [False] * 3, pad_id=2)
    out = []
    for lean in (False, True):
        model = load_model(tiny_model_path, "float32")
        if lean:
            assert use_lean_activations(model) == 3 * model.config.num_hidden_layers + 1
        lp = token_scores(model, b.input_ids, b.attention_mask, b.loss_mask).logprobs
        lp.sum().backward()
        out.append((lp.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=0)
    for name, g in out[0][1].items():
        torch.testing.assert_close(out[1][1][name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_release_freed_memory_returns_heap_pages():
    proc = psutil.Process()
    blocks = [torch.ones(4096) for _ in range(40_000)]  # 16 KiB each: heap (not mmap) allocations, ~640 MiB
    pin = torch.ones(16)  # a live block above them: free() alone then returns nothing to the OS
    del blocks
    freed = proc.memory_info().rss
    release_freed_memory()
    assert freed - proc.memory_info().rss > 300 * 2**20
    assert pin.sum() == 16
