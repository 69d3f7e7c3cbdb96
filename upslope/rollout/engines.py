"""Pick and build the rollout engine named in the config, through the `engine` registry.

An engine plugin is a builder `fn(cfg: EngineConfig, ctx: EngineContext, *, options) -> Engine`
registered with `@ENGINES.register(name, requires=..., auto_rank=..., model_check=...)`: `requires`
names the module it needs (checked before building), `engine.name=auto` takes the available engine
with the lowest `auto_rank` (vllm 0, hf 1; an engine without one is never picked by auto), and
`model_check(model_path) -> reason | None` says why the engine cannot run a model (asked before its
builder runs). A builder raises EngineUnavailable when it cannot run the model: either way auto then
takes the next engine (one line says so);
an engine named explicitly stops with one line (before any work, when its model_check refuses).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from upslope.engine import Engine
from upslope.errors import ConfigError, EngineUnavailable
from upslope.registry import ENGINES, Entry

if TYPE_CHECKING:
    from upslope.config import EngineConfig


@dataclass(frozen=True)
class EngineContext:
    """What the run supplies to every engine builder (the config supplies the rest)."""

    model_path: str
    tokenizer: Any
    model_dtype: str  # the learner's weights' dtype (model.dtype resolved)
    max_model_len: int
    kv_tokens: int = 0  # tokens of one rollout batch (sizes vLLM's CPU KV cache)
    threads: int = 0  # > 0: a fixed thread count; 0: fitted to the free cores before each generation
    device: str = "cpu"  # the learner's device: an engine that can runs there (colocated)
    trust_remote_code: bool = False  # model.trust_remote_code: the model directory's own code may run


def is_available(entry: Entry[Any]) -> bool:
    """Whether the module an engine `requires` (if any) is importable."""
    need = entry.traits.requires
    return need is None or importlib.util.find_spec(need) is not None


def auto_engine(entries: list[Entry[Any]]) -> str:
    """The available engine with the lowest `auto_rank` among `entries` (those without one are skipped)."""
    ranked = sorted((e for e in entries if e.traits.auto_rank is not None), key=lambda e: e.traits.auto_rank)
    for entry in ranked:
        if is_available(entry):
            return entry.name
    raise ConfigError("engine.name=auto: no rollout engine is available "
                      f"(auto picks among {', '.join(e.name for e in ranked) or 'none'})")


def engine_name(cfg: EngineConfig) -> str:
    """The registered engine `engine.name` selects (auto: the available one with the lowest auto_rank)."""
    if cfg.name == "auto":
        return auto_engine(ENGINES.entries())
    entry = ENGINES.get(cfg.name, "engine.name")
    if not is_available(entry):
        hint = entry.traits.install
        raise ConfigError(f"engine.name={cfg.name}: {entry.traits.requires} is not installed"
                          + (f" ({hint})" if hint else ""))
    return entry.name


def check_speculative(cfg: EngineConfig, name: str) -> None:
    """Speculative decoding asked of an engine that does not offer it is one ConfigError line."""
    if cfg.speculative.method != "off" and name != "vllm":
        raise ConfigError(f"engine.speculative.method={cfg.speculative.method}: only the vllm engine offers "
                          f"speculative decoding (this run's engine: {name})")


def check_engine_runs(cfg: EngineConfig, model_path: str) -> None:
    """An engine named explicitly (engine.name other than auto) that is not installed, or whose
    model_check refuses this model, or that cannot do what engine.* asks of it, is one ConfigError line
    now, before any work (auto instead falls back when the engine starts)."""
    if cfg.name == "auto":
        return
    check_speculative(cfg, engine_name(cfg))
    check = ENGINES.get(engine_name(cfg), "engine.name").traits.model_check
    reason = check(model_path) if check is not None else None
    if reason:
        raise ConfigError(f"engine.name={cfg.name}: {reason}; use engine.name=hf (any transformers model)")


def kv_cache_gb_for(model_path: str, tokens: int, dtype_bytes: int = 2, max_gb: float = 1.0) -> float:
    """KV-cache size (GiB, rounded up to 1/16) holding `tokens` tokens of this model, at most `max_gb`:
    layers x kv heads x head dim x 2 (keys and values) x dtype bytes per token."""
    import json
    import math
    from pathlib import Path

    mc = json.loads((Path(model_path) / "config.json").read_text())
    mc = mc.get("text_config") or mc  # a vision-language checkpoint: its language model's
    heads = mc["num_attention_heads"]
    head_dim = mc.get("head_dim") or mc["hidden_size"] // heads
    per_token = mc["num_hidden_layers"] * mc.get("num_key_value_heads", heads) * head_dim * 2 * dtype_bytes
    return min(max_gb, max(1.0, math.ceil(tokens * per_token / 2**30 * 16)) / 16)


def make_engine(cfg: EngineConfig, model_path: str, tokenizer: Any, model_dtype: str, max_model_len: int,
                kv_tokens: int = 0, threads: int = 0, device: str = "cpu", announce: Any = print,
                dtype_chosen: bool = False, trust_remote_code: bool = False) -> Engine:
    """The configured engine, built by its registered builder with `engine.options`; `kv_tokens` (one
    rollout batch's tokens) sizes vLLM's CPU KV cache unless engine.kv_cache_gb is set; `threads` > 0
    fixes the thread count, 0 fits it to the free cores before each generation. An engine that cannot
    run the model (EngineUnavailable) gives way, with `engine.name=auto`, to the next one auto ranks
    (one `announce`d line; its dtype is its own default when `dtype_chosen`, engine.dtype having been
    picked by auto for the first engine); a name set explicitly stops there, in one line."""
    name = engine_name(cfg)
    check_speculative(cfg, name)
    build = ENGINES.bind(name, cfg.options, where="engine.options")
    ctx = EngineContext(model_path, tokenizer, model_dtype, max_model_len, kv_tokens, threads, device,
                        trust_remote_code)
    check = ENGINES.get(name, "engine.name").traits.model_check
    try:
        reason = check(model_path) if check is not None else None
        if reason:
            raise EngineUnavailable(reason)
        return build(cfg, ctx)
    except EngineUnavailable as exc:
        if cfg.name != "auto":
            raise ConfigError(f"engine.name={cfg.name}: {exc}; use engine.name=hf (any transformers model)") from exc
        others = [e for e in ENGINES.entries() if e.name != name]
        try:
            fallback = auto_engine(others)
        except ConfigError:
            raise ConfigError(f"engine.name=auto: {exc}, and no other engine is available") from exc
        check_speculative(cfg, fallback)
        announce(f"engine: {exc}; using the {fallback} engine instead")
        update: dict[str, Any] = {"name": fallback, "options": {}}  # engine.options were the first engine's
        if dtype_chosen:
            update["dtype"] = "auto"
        return ENGINES.bind(fallback, {}, where="engine.options")(cfg.model_copy(update=update), ctx)
