"""Sparse upcycling: a Llama-architecture model made into a Mixtral MoE whose every MLP is copied into
`experts` experts (each perturbed by a little noise so that they differ) behind a fresh router that
sends each token to `top_k` of them. Mixtral's attention, norms, embeddings and head are Llama's, and
its router renormalises the top-k weights, so with no noise the MoE computes exactly the dense model
(the experts are equal and their weights sum to 1); training then specialises the experts.

Used to make a small MoE that reads and answers (the embedded SmolLM2-135M) for routing-replay
experiments, where a random-init MoE would only babble.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# the Llama config fields a Mixtral config takes over unchanged
SHARED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                 "rope_parameters", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")


def moe_config(dense: Any, experts: int, top_k: int) -> Any:
    """The Mixtral config of `dense` (a LlamaConfig) with `experts` experts per layer, `top_k` per token."""
    from transformers import MixtralConfig

    if dense.model_type != "llama" or getattr(dense, "attention_bias", False) or getattr(dense, "mlp_bias", False):
        raise ValueError(f"upcycling takes a Llama model without biases, not {dense.model_type}")
    fields = {k: getattr(dense, k) for k in SHARED_FIELDS if getattr(dense, k, None) is not None}
    return MixtralConfig(**fields, num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=None,
                         router_jitter_noise=0.0, output_router_logits=False)


def upcycle(dense: Any, experts: int = 4, top_k: int = 2, noise: float = 0.01, router_std: float = 0.02,
            seed: int = 0) -> Any:
    """A MixtralForCausalLM from `dense` (a LlamaForCausalLM): the dense model's weights, each layer's MLP
    copied into every expert plus `noise` x the weight's RMS x N(0, 1) (independently per expert), and a
    router drawn from N(0, router_std^2)."""
    from transformers import MixtralForCausalLM

    gen = torch.Generator().manual_seed(seed)
    moe = MixtralForCausalLM(moe_config(dense.config, experts, top_k)).to(dense.dtype)
    dense_weights = dense.state_dict()
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if ".mlp." not in name:
                p.copy_(dense_weights[name])
        for i, layer in enumerate(dense.model.layers):
            mlp, block = layer.mlp, moe.model.layers[i].mlp
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0)
            for e in range(experts):
                block.experts.gate_up_proj[e].copy_(_noisy(gate_up, noise, gen))
                block.experts.down_proj[e].copy_(_noisy(mlp.down_proj.weight, noise, gen))
            block.gate.weight.copy_(torch.randn(block.gate.weight.shape, generator=gen) * router_std)
    if moe.config.tie_word_embeddings:
        moe.tie_weights()
    return moe


def _noisy(weight: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    if not noise:
        return weight
    rms = weight.float().pow(2).mean().sqrt()
    return weight + (torch.randn(weight.shape, generator=gen) * noise * rms).to(weight.dtype)


def upcycle_directory(source: str, target: str | Path, experts: int = 4, top_k: int = 2, noise: float = 0.01,
                      seed: int = 0) -> str:
    """`upcycle` the model at `source` and save it with its tokenizer under `target` (kept when it is there)."""
    from upslope.fsutil import atomic_directory
    from upslope.models import load_model, load_tokenizer

    target = Path(target)
    if (target / "config.json").exists():
        return str(target)
    moe = upcycle(load_model(source, "float32"), experts, top_k, noise, seed=seed)
    with atomic_directory(target, prefix=".upcycle-") as tmp:
        moe.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(source).save_pretrained(tmp)
        chat = Path(source) / "chat_template.jinja"
        if chat.exists() and not (Path(tmp) / "chat_template.jinja").exists():
            (Path(tmp) / "chat_template.jinja").write_text(chat.read_text())
    return str(target)
