"""Tiny random-init models of each model family upslope supports, built from configs (nothing is
downloaded) with a given tokenizer, so that every check runs on the real architecture code of each
family: its attention (sliding windows, soft-capped scores, attention sinks, latent attention), its recurrent
layers (hybrids: short convolutions, Mamba-2, gated delta-rule linear attention), its head (soft-capped,
scaled logits), its norms and its experts (shared experts, softmax or sigmoid group routing).

Each family is made so that its special parts act at these sizes: windows shorter than the test
sequences, weights scaled up so that logits reach the soft-cap, experts that differ from each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Family:
    """A family: its transformers config class name and the settings that make its parts act."""

    config: str  # the transformers config class
    settings: dict[str, Any] = field(default_factory=dict)
    moe: bool = False
    weight_scale: float = 1.0  # random weights multiplied by this (large logits reach a soft-cap)


HIDDEN = "<hidden size>"  # a setting equal to the model's hidden size (LFM2's checkpoints carry `conv_dim` and `block_dim`)

# head_dim 64 everywhere: the size vLLM's CPU attention supports (DeepSeek-V3: 32 without and 32 with rotary)
FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig"),
    "qwen2": Family("Qwen2Config"),
    "qwen3": Family("Qwen3Config"),
    "mistral": Family("MistralConfig", {"sliding_window": 16}),
    "gemma": Family("GemmaConfig", {"tie_word_embeddings": True}),
    "gemma2": Family("Gemma2Config", {"sliding_window": 16, "final_logit_softcapping": 4.0, "tie_word_embeddings": True,
                                      "attn_logit_softcapping": 8.0, "query_pre_attn_scalar": 64}, weight_scale=6.0),
    "gemma3": Family("Gemma3TextConfig", {"sliding_window": 16, "final_logit_softcapping": 4.0, "tie_word_embeddings": True,
                                          "query_pre_attn_scalar": 64, "layer_types": ["sliding_attention",
                                                                                       "full_attention"]},
                     weight_scale=6.0),
    "phi3": Family("Phi3Config"),
    "olmo2": Family("Olmo2Config"),
    "granite": Family("GraniteConfig", {"logits_scaling": 4.0}),
    "qwen3_moe": Family("Qwen3MoeConfig", {"moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
                                           "decoder_sparse_step": 1, "mlp_only_layers": []}, moe=True),
    "mixtral": Family("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}, moe=True),
    "olmoe": Family("OlmoeConfig", {"num_experts": 4, "num_experts_per_tok": 2}, moe=True),
    "qwen2_moe": Family("Qwen2MoeConfig", {"moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
                                           "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                                           "mlp_only_layers": []}, moe=True),
    "deepseek_v3": Family("DeepseekV3Config", {"moe_intermediate_size": 64, "n_routed_experts": 4,
                                               "num_experts_per_tok": 2, "n_shared_experts": 1,
                                               "first_k_dense_replace": 0, "n_group": 2, "topk_group": 1,
                                               "kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 32,
                                               "qk_nope_head_dim": 32, "v_head_dim": 64, "head_dim": 32,
                                               "num_key_value_heads": 2, "topk_method": "noaux_tc"},
                          moe=True),
    "gpt_oss": Family("GptOssConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16,
                                       "layer_types": ["sliding_attention", "full_attention"]}, moe=True),
    "phimoe": Family("PhimoeConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}, moe=True),
    # chunks of 128 tokens (vLLM's page size divides them): tests/train/learner/test_packing.py makes them act
    "llama4": Family("Llama4TextConfig", {"num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size_mlp": 256,
                                          "attention_chunk_size": 128}, moe=True),
    # hybrids: recurrent layers (a short convolution, Mamba-2, gated delta-rule linear attention) beside attention
    "lfm2": Family("Lfm2Config", {"layer_types": ["conv", "full_attention"], "conv_dim": HIDDEN, "block_dim": HIDDEN,
                                  "tie_word_embeddings": True}),
    "falcon_h1": Family("FalconH1Config", {"mamba_d_ssm": 256, "mamba_n_heads": 8, "mamba_d_head": 32,
                                           "mamba_d_state": 16, "mamba_chunk_size": 16, "lm_head_multiplier": 2.0}),
    "granitemoehybrid": Family("GraniteMoeHybridConfig", {"layer_types": ["mamba", "attention"], "num_local_experts": 4,
                                                          "num_experts_per_tok": 2, "shared_intermediate_size": 64,
                                                          "mamba_n_heads": 8, "mamba_d_head": 32, "mamba_d_state": 16,
                                                          "mamba_chunk_size": 16}, moe=True),
    "qwen3_next": Family("Qwen3NextConfig", {"layer_types": ["linear_attention", "full_attention"], "num_experts": 4,
                                             "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                             "shared_expert_intermediate_size": 64, "linear_key_head_dim": 32,
                                             "linear_value_head_dim": 32, "linear_num_key_heads": 2,
                                             "linear_num_value_heads": 4}, moe=True),
}


def family_config(name: str, tokenizer: Any, layers: int = 2, hidden: int = 128) -> Any:
    """The config of a tiny `name` model whose vocabulary and special tokens are `tokenizer`'s."""
    import transformers

    family = FAMILIES[name]
    settings = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                    num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64), num_key_value_heads=1,
                    head_dim=64, max_position_embeddings=2048, tie_word_embeddings=False,
                    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    settings.update({k: hidden if v == HIDDEN else v for k, v in family.settings.items()})
    if "layer_types" in settings:
        settings["layer_types"] = (settings["layer_types"] * layers)[:layers]
    return getattr(transformers, family.config)(**settings)


def make_family_model(name: str, tokenizer_source: str, target: str | Path, layers: int = 2, hidden: int = 128,
                      seed: int = 0) -> str:
    """A tiny random-init `name` model with `tokenizer_source`'s tokenizer, saved under `target` (kept
    when it is there already)."""
    from transformers import AutoModelForCausalLM

    from upslope.fsutil import atomic_directory
    from upslope.models import load_tokenizer

    target = Path(target)
    if (target / "config.json").exists():
        return str(target)
    tokenizer = load_tokenizer(tokenizer_source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(name, tokenizer, layers, hidden), dtype=torch.float32)
    scale = FAMILIES[name].weight_scale
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.mul_(scale)
    with atomic_directory(target, prefix=".family-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return str(target)
