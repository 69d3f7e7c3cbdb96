"""Shard the learner's model across the ranks and reduce its gradients.

ddp: every rank holds the whole model; after a rank's micro-batches the gradients are summed
with one all-reduce per parameter (not torch's DistributedDataParallel: ranks run different
numbers of micro-batches, balanced by tokens rather than by count, and DDP's reducer would
all-reduce after every backward or need the same number of backwards on every rank; one sum per
optimiser step also matches the loss normalisers, which already divide by the GLOBAL counts).
fsdp: FSDP2 `fully_shard` on each decoder layer, then on the root (the embeddings, the tied
head and the final norm), so parameters, gradients and optimiser state are DTensor shards.
Only rank 0 reads the weights from disk; the other ranks build the model on the meta device
and receive their shards from it, so no rank but 0 ever holds the whole model.
A LoRA-wrapped policy is sharded the same way: each decoder layer's unit holds its frozen base
weights and its adapter matrices, and only the adapter's gradients are reduced."""
from __future__ import annotations

import functools
import types
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from upslope.config import DistConfig, ModelConfig, OptimConfig, TrainConfig
from upslope.distributed import group
from upslope.distributed.group import world
from upslope.errors import ConfigError


def check_combination(d: DistConfig, optim: OptimConfig, model: ModelConfig, device: torch.device) -> None:
    """One ConfigError line for a dist option combination the sharded learner cannot run."""
    if d.learner_procs == 1:
        return
    if d.strategy == "fsdp":
        low = model.dtype != "float32"
        if optim.state_dtype == "int8" or (optim.state_dtype == "auto" and low):
            raise ConfigError("dist.strategy=fsdp: 8-bit AdamW moments are quantised in 256-value blocks of the whole "
                              "tensor and cannot be sharded; set optim.state_dtype=bfloat16 or float32 (or "
                              "dist.strategy=ddp)")
    if d.cpu_offload and (d.strategy != "fsdp" or device.type != "cuda"):
        raise ConfigError("dist.cpu_offload=true keeps FSDP shards in CPU memory while a GPU computes: it needs "
                          "dist.strategy=fsdp and a GPU learner")
    if d.backend == "nccl" and device.type != "cuda":
        raise ConfigError("dist.backend=nccl needs GPUs; this learner runs on the CPU (use gloo or auto)")


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The repeated transformer blocks (HF causal LMs: model.model.layers; under a LoRA adapter
    those of the wrapped base model, adapter layers included; a scalar-head model's body.layers),
    each one FSDP unit."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.body if hasattr(base, "body") else getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ConfigError(f"dist.strategy=fsdp: {type(model).__name__} has no model.layers to shard per decoder "
                          f"layer; use dist.strategy=ddp")
    return list(layers)


def state_module(model: Any) -> Any:
    """The module whose state dict names the model's parameters (a scalar-head model's HF net)."""
    return getattr(model, "state_module", model)


def shard_model(model: Any, d: DistConfig, train: TrainConfig, device: torch.device) -> Any:
    """The model as this rank holds it, its weights read from disk by rank 0 alone: rank 0 passes
    the loaded model, every other rank the same architecture with its parameters on the meta
    device (`load_model(empty=True)`), materialised here. ddp: each rank holds the whole, every
    parameter and buffer broadcast from rank 0 in place. fsdp: FSDP2 `fully_shard` per decoder
    layer, then the root (bf16 compute: a MixedPrecisionPolicy that all-gathers bf16 and reduces
    gradients in fp32), each rank's shards filled from rank 0's full state dict one tensor at a
    time (torch's `set_model_state_dict(broadcast_from_rank0=True)`), the buffers broadcast.
    Either way rank 0's values replace what the others drew (a fresh head or LoRA adapter)."""
    main = group.is_main()
    if d.strategy == "ddp":
        if not main:
            model.to_empty(device=device)
            if hasattr(model, "tie_weights"):  # to_empty made separate tensors of the tied ones
                model.tie_weights()
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    full = state_module(model).state_dict() if main else {}  # keeps rank 0's full tensors while it shards
    kw: dict[str, Any] = {}
    if train.precision == "bfloat16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if d.cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    # a frozen model (a reference, a teacher) has no backward to reshard its root after: every forward does
    frozen = not any(p.requires_grad for p in model.parameters())
    fully_shard(model, **kw, **({"reshard_after_forward": True} if frozen else {}))
    for name in getattr(model, "forward_methods", ()):
        register_fsdp_forward_method(model, name)
    if not main:  # this rank's (uninitialised) shards
        model.to_empty(device=torch.device("cpu") if d.cpu_offload else device)
    for b in model.buffers():
        dist.broadcast(b, src=0)
    set_model_state_dict(state_module(model), full,
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


ENTRY = "upslope_forward"  # the method through which a sharded model's custom forward runs


def register_entry(model: Any, fn: Callable[..., Any]) -> None:
    """Run `fn(model, ...)` as a forward of the FSDP root: upslope's log-prob forward calls the
    decoder body and the (tied) head itself rather than `model.forward`, and the root's
    parameters (embeddings, head, final norm) are gathered only around a registered forward."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    setattr(model, ENTRY, types.MethodType(fn, model))
    register_fsdp_forward_method(model, ENTRY)


def entry(model: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` bound to `model`: through the FSDP root when `register_entry` registered it, else directly."""
    return getattr(model, ENTRY, None) or functools.partial(fn, model)


def is_sharded(model: Any) -> bool:
    """Is the model FSDP2-sharded (DTensor parameters)?"""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def agree(model: Any, flags: tuple[bool, ...], device: torch.device) -> tuple[bool, ...]:
    """`flags` as every rank of a sharded model holds them: each one's AND over the ranks (one small
    all-reduce). A forward's plan (shared prompt pass, packed sequence) decides how many times each
    FSDP unit gathers its shards; ranks with different micro-batches could otherwise plan different
    passes, and their collectives would pair up wrongly and hang in backward."""
    if world() == 1 or not is_sharded(model):
        return flags
    votes = torch.tensor([int(f) for f in flags], device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MIN)
    return tuple(bool(v) for v in votes.tolist())


def loss_scale(model: Any) -> float:
    """Factor on each micro-batch loss before backward: FSDP averages the reduced gradients over
    the ranks (gloo has no pre-scaled sum), and the normalised losses need their plain sum."""
    return float(world()) if is_sharded(model) else 1.0


def sum_gradients(model: Any) -> None:
    """ddp: every trainable parameter's gradient summed over the ranks (zeros where a rank ran
    no micro-batch). FSDP reduces its shards in backward already."""
    if world() == 1 or is_sharded(model):
        return
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective), anything else as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_weights(model: Any, main: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's parameters by name, one full tensor at a time (gathered from the shards on
    every rank, one parameter in memory beyond the shards), yielded on the main rank only:
    every rank must run the iteration to its end."""
    for name, p in model.named_parameters():
        full = plain(p.detach())
        if main:
            yield name, full
        del full
