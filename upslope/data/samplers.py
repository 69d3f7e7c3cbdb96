"""Prompt samplers: which prompts each step trains on. State is saved in checkpoints so a
resumed run draws exactly the prompts the uninterrupted run would have drawn.

A sampler plugin is a class registered in `SAMPLERS`, built as
`cls(num_prompts, seed, shuffle, *, options)` (`data.sampler` names it and gives the
options; `shuffle` is `data.shuffle`), with `next(count) -> indices`, `update(indices,
rewards, group_ids)` and `state_dict()` / `load_state_dict()`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from upslope.registry import SAMPLERS

if TYPE_CHECKING:
    from upslope.config import DataConfig


@SAMPLERS.register("uniform")
class UniformSampler:
    """Epochs over the prompts, reshuffled each epoch with a seeded generator."""

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True):
        self.num_prompts, self.seed, self.shuffle = num_prompts, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        gen = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return torch.randperm(self.num_prompts, generator=gen).tolist()

    def next(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.position >= self.num_prompts:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            take = min(count - len(out), self.num_prompts - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    def update(self, indices: list[int], rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
        """Per-prompt statistics feedback (unused by the uniform sampler; curricula use it)."""

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()


def make_sampler(data: DataConfig, num_prompts: int, seed: int) -> Any:
    """The sampler `data.sampler` names, over `num_prompts` prompts, seeded (options checked)."""
    build = SAMPLERS.bind(data.sampler.name, data.sampler.options, where="data.sampler.options")
    return build(num_prompts, seed, data.shuffle)
