"""LoRA (PEFT) for every trainer: wrap the policy in an adapter, see it with the adapter
switched off (the frozen reference, without a second copy), push merged weights to the
rollout engine, and turn adapter checkpoints into plain Hugging Face models (export, or
merge on load)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from upslope.config import LoraConfig
from upslope.errors import ConfigError, UpslopeError
from upslope.fsutil import atomic_directory
from upslope.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS, decoder_body, merge_adapter

ADAPTER = "default"  # PEFT's name for the (only) adapter
__all__ = ["ADAPTER", "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "merge_adapter"]  # merging lives in models (loading)


def is_adapted(model: Any) -> bool:
    """Is `model` a PEFT-wrapped policy?"""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def is_adapter_dir(path: str | Path) -> bool:
    """Does `path` hold a saved adapter (PEFT's adapter_config.json) rather than a full model?"""
    return (Path(path) / ADAPTER_CONFIG).exists()


def linear_layers(model: Any) -> list[str]:
    """Full names of the model's linear layers, the LM head excluded: what LoRA can adapt. A vision-language
    model, which upslope runs on text alone, adapts its language decoder's only (not its vision tower's)."""
    head = model.get_output_embeddings()
    within = None
    if getattr(getattr(model, "config", None), "vision_config", None) is not None:
        within = {id(m) for m in decoder_body(model).modules()}
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head
            and (within is None or id(m) in within)]


def routers(model: Any) -> set[str]:
    """Full names of the MoE routers: a module with a weight beside a sibling `experts` module (the gate that
    picks each token's experts: Qwen-MoE's and OLMoE's `mlp.gate`, Mixtral's; a linear layer in older
    transformers, a router module of its own in transformers 5)."""
    found = set()
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        if isinstance(experts, torch.nn.Module):
            found.update(f"{name}.{child}" if name else child for child, m in module.named_children()
                         if m is not experts and isinstance(getattr(m, "weight", None), torch.Tensor))
    return found


def resolve_targets(model: Any, targets: list[str] | str) -> list[str]:
    """The short names of the layers to adapt (auto: every linear layer but the head and the MoE routers,
    which is the attention and MLP projections under whatever names the architecture gives them); a
    name matching no linear layer is a ConfigError listing the names that exist. A MoE model's experts
    are fused 3-D weights, not linear layers: LoRA adapts their attention (and shared dense MLPs)."""
    layers = linear_layers(model)
    short = sorted({name.rpartition(".")[2] for name in layers})
    if targets == "all-linear":
        return short
    if targets == "auto":
        skip = routers(model)
        return sorted({name.rpartition(".")[2] for name in layers if name not in skip}
                      - {name.rpartition(".")[2] for name in skip})
    for t in targets:
        if not any(name == t or name.endswith("." + t) for name in layers):
            raise ConfigError(f"lora.target_modules: '{t}' is not a linear layer of this model "
                              f"(its linear layers: {', '.join(short)}; or 'auto' or 'all-linear')")
    return list(targets)


def wrap(model: Any, cfg: LoraConfig) -> Any:
    """The policy with a fresh LoRA adapter (B = 0, so it starts as the base model); only the
    adapter's parameters require gradients."""
    import peft

    config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                             target_modules=resolve_targets(model, cfg.target_modules), task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config, adapter_name=ADAPTER)


class AdapterOff:
    """The adapted policy seen with its adapter switched off, i.e. the base model: the frozen
    reference for KL or DPO, sharing the policy's weights instead of a second copy. It offers
    what the log-prob forwards use: calling it, `get_decoder()`, `get_output_embeddings()`, `config`,
    `set_attn_implementation()`."""

    def __init__(self, model: Any):
        from upslope.distributed.shard import ENTRY

        self.model = model
        sharded = getattr(model, ENTRY, None)  # an FSDP root gathers its weights only around this forward
        if sharded is not None:
            setattr(self, ENTRY, lambda *args, **kwargs: self._off(sharded, *args, **kwargs))

    def _off(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return fn(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._off(self.model, *args, **kwargs)

    def get_decoder(self) -> Callable[..., Any]:
        decoder = decoder_body(self.model)
        return lambda *args, **kwargs: self._off(decoder, *args, **kwargs)

    def get_output_embeddings(self) -> Any:
        return self.model.get_output_embeddings()

    def set_attn_implementation(self, name: str) -> None:
        """The attention implementation of the shared layers (the packed forward registers its own)."""
        self.model.set_attn_implementation(name)

    @property
    def config(self) -> Any:
        return self.model.config


def _merged(weight: torch.Tensor, layer: Any) -> torch.Tensor:
    """W + scale * B @ A of one adapted linear layer (one fused addmm, in fp32), in W's dtype; each
    operand gathered whole from its shards first when the model is FSDP-sharded."""
    from upslope.distributed.shard import plain

    a, b = plain(layer.lora_A[ADAPTER].weight).float(), plain(layer.lora_B[ADAPTER].weight).float()
    weight = plain(weight)
    return torch.addmm(weight.float(), b, a, alpha=layer.scaling[ADAPTER]).to(weight.dtype)


@torch.no_grad()
def merged_weights(model: Any, main: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """What the adapter changes, as full tensors under the base model's HF names: every parameter
    of each block (attention, MLP) that holds an adapted layer, W + scale * B @ A for the adapted
    weights, without touching the model. Whole blocks, because vLLM fuses q/k/v and gate/up into
    one tensor, and a partial update of a fused tensor would leave its other parts unset; all
    other weights are frozen, so the engine still has them. From an FSDP-sharded model one tensor
    at a time is gathered (a collective: every rank runs the iteration to its end, and only the
    `main` rank gets the tensors)."""
    from peft.tuners.lora import LoraLayer

    from upslope.distributed.shard import plain

    modules = dict(model.get_base_model().named_modules())
    blocks = sorted({name.rpartition(".")[0] for name, m in modules.items() if isinstance(m, LoraLayer)})
    sent: set[str] = set()
    for block in blocks:
        for name, p in modules[block].named_parameters(prefix=block):
            owner, _, leaf = name.rpartition(".")
            if ".lora_" in name or name in sent:
                continue
            sent.add(name)
            if owner.endswith(".base_layer"):
                owner = owner[: -len(".base_layer")]
                full = _merged(p.detach(), modules[owner]) if leaf == "weight" else plain(p.detach())
            else:
                full = plain(p.detach())
            if main:
                yield f"{owner}.{leaf}", full
            del full


def adapter_weights(adapter_dir: Path) -> dict[str, torch.Tensor]:
    """A saved adapter's weights under the adapted model's own parameter names (PEFT saves them
    without the adapter's name: `...q_proj.lora_A.weight` is the live `...q_proj.lora_A.default.weight`)."""
    from safetensors.torch import load_file

    return {re.sub(r"\.(lora_[AB])\.", rf".\1.{ADAPTER}.", k): v
            for k, v in load_file(adapter_dir / ADAPTER_WEIGHTS).items()}


def load_adapter(model: Any, adapter_dir: Path) -> None:
    """Copy a saved adapter's weights into the adapted `model`; its rank and targets must match."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    live = model.peft_config[ADAPTER]
    want = (live.r, float(live.lora_alpha), sorted(live.target_modules))
    got = (saved.get("r"), float(saved.get("lora_alpha", 0)), sorted(saved.get("target_modules") or []))
    if want != got:
        raise UpslopeError(f"{adapter_dir}: the saved adapter (rank {got[0]}, alpha {got[1]:g}, targets {got[2]}) "
                           f"differs from lora.* (rank {want[0]}, alpha {want[1]:g}, targets {want[2]})")
    result = set_peft_model_state_dict(model, load_file(adapter_dir / ADAPTER_WEIGHTS), adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise UpslopeError(f"{adapter_dir}: adapter does not match the model (missing {missing[:2]}, "
                           f"unexpected {result.unexpected_keys[:2]})")


def checkpoint_model_dir(path: Path) -> Path:
    """The model directory of a checkpoint: `path` itself, or its `model/` (RUN/checkpoints/step_N)."""
    for candidate in (path, path / "model"):
        if is_adapter_dir(candidate) or (candidate / "config.json").exists():
            return candidate
    raise UpslopeError(f"{path}: not a checkpoint (expected RUN/checkpoints/step_N or its model/ directory)")


def export(checkpoint: Path, out_dir: Path, force: bool = False) -> tuple[Path, bool]:
    """`upslope export`: a checkpoint as a plain Hugging Face model directory (adapter merged into
    its base; a full-model checkpoint copied). Returns (out_dir, whether it was an adapter).
    The model is built in a temp directory beside `out_dir` and renamed into place, so nothing
    is written unless it succeeds; a non-empty `out_dir` is replaced only with `force`."""
    if not checkpoint.exists():
        raise UpslopeError(f"{checkpoint}: checkpoint not found (expected RUN/checkpoints/step_N)")
    src = checkpoint_model_dir(checkpoint)
    check_export_target(src, out_dir, force)
    if is_adapter_dir(src):
        return merge_adapter(src, out_dir, replace=force), True
    with atomic_directory(out_dir, prefix=f".{out_dir.resolve().name}-", replace=force) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    return out_dir, False


def check_export_target(src: Path, out_dir: Path, force: bool) -> None:
    """Refuse (one line) any target whose replacement could lose something: a non-empty
    directory without `force`; with it, still never a file, the checkpoint itself or a
    directory holding it (e.g. its run), the current directory or one above it, or /."""
    from upslope.fsutil import is_empty_dir

    target, source, cwd = out_dir.resolve(), src.resolve(), Path.cwd().resolve()
    for p in [out_dir, *out_dir.parents]:
        if p.exists() or p.is_symlink():
            if p.is_symlink() or not p.is_dir():
                kind = "a link" if p.is_symlink() else "a file"
                raise UpslopeError(f"export: {p} is {kind}{'' if p == out_dir else ' (in the output path)'}; "
                                   f"give a new or empty directory as OUT_DIR")
            break
    if not out_dir.exists() or is_empty_dir(out_dir):
        return
    if not force:
        raise UpslopeError(f"export: {out_dir} is not empty; give a new or empty directory "
                           f"(or --force to replace it)")
    if target == source or target in source.parents:
        raise UpslopeError(f"export: {out_dir} holds the checkpoint {src}; not replacing it, even with --force")
    if target == cwd or target in cwd.parents:
        raise UpslopeError(f"export: {out_dir} is the current directory or above it; not replacing it, "
                           f"even with --force")
    if target == Path(target.anchor) or target == Path.home().resolve():
        raise UpslopeError(f"export: {out_dir} is / or the home directory; not replacing it, even with --force")
