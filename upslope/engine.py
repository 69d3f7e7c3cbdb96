"""The rollout engine interface: token ids in, completions with per-token log-probs out,
and new weights pushed in place between steps."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterable

import torch


@dataclass
class SamplingParams:
    """How to sample. temperature 0 means greedy. Log-probs returned are those of the
    distribution sampled from (temperature-scaled; top-p/top-k truncated when set)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    routed_experts: bool = False  # also return the experts a MoE model routed each token to (routing replay)
    ignore_eos: bool = False  # run every reply to max_new_tokens, stop tokens ignored (throughput benchmarks)


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, the stop token included when one ended it
    logprobs: list[float]  # the sampler's log-prob of each generated token
    text: str  # decoded completion, special tokens skipped
    finish_reason: str  # "stop" (a stop token) or "length" (max_new_tokens)
    # with SamplingParams.routed_experts: [prompt + completion tokens, MoE layers, experts per token] int16,
    # the experts each token was routed to (-1: not run through the model, e.g. the last token)
    routed_experts: torch.Tensor | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class Engine(ABC):
    """A generation backend. `version` counts weight updates received."""

    name: str = "engine"
    version: int = 0
    device: str = "cpu"  # where it generates (reported in the step metrics)
    max_model_len: int | None = None  # the longest prompt + completion it takes (None: no fixed bound)

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """For each prompt (token ids), `params.n` completions."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place with the learner's (HF parameter names)."""

    def sleep(self) -> None:
        """Free the engine's accelerator memory while the learner trains (a GPU-colocated engine);
        the next `update_weights` or `generate` brings it back. A no-op for most engines."""

    def close(self) -> None:
        """Release the engine's resources."""
