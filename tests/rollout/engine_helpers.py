"""Helpers of the engine tests (imported by module name: pytest puts this folder on sys.path)."""
from __future__ import annotations

import torch


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def teacher_forced_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 0.0) -> torch.Tensor:
    """log p(token | prefix) of `completion` under `model`, temperature-scaled, in fp32."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
    return lp.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def divergence_margin(model, prompt: list[int], ref: list[int], other: list[int]) -> tuple[int, float] | None:
    """Where greedy `other` first leaves greedy `ref` (computed by `model`), and the fp32
    logit gap there between ref's token and other's token (>= 0: ref's is the argmax).
    None when one sequence is a prefix of the other."""
    k = common_prefix(ref, other)
    if k == min(len(ref), len(other)):
        return None
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref[:k]])).logits[0, -1].float()
    return k, float(logits[ref[k]] - logits[other[k]])
