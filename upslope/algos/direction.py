"""DiRL (*Reasoning or Memorization? Direction-Aware Diversity Exploration in LLM Reinforcement Learning*,
2026): a rollout's variation from its group is rewarded when it points along a reasoning direction of the
policy's representations and penalised when it points against it (toward memorised patterns). Registered with
`features="hidden_mean"`: each rollout's mean last-layer hidden state (upslope.train.learner.salience)."""
from __future__ import annotations

import functools
import pickle

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import NonNegative
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


@functools.lru_cache(maxsize=4)
def load_direction(path: str) -> Tensor:
    """The [D] direction saved with torch.save at `path` (one clear line when it is not one)."""
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise ConfigError(f"advantage 'dirl' direction_path={path}: cannot read a saved tensor "
                          f"({type(exc).__name__})") from None
    if not isinstance(d, Tensor) or d.dim() != 1:
        raise ConfigError(f"advantage 'dirl' direction_path={path}: expected a 1-D tensor (one hidden-state "
                          f"direction)")
    return d.to(torch.float64)


def success_direction(features: Tensor, rewards: Tensor, group_ids: Tensor) -> Tensor | None:
    """[D] unit vector: over the groups whose rewards differ, the mean of (mean feature of the rollouts above
    the group's mean reward - mean feature of the rest); None when no group's rewards differ."""
    f, r = features.to(torch.float64), rewards.to(torch.float64)
    moves = []
    for g in group_ids.unique():
        rows = group_ids == g
        above = rows & (r > r[rows].mean())
        if bool(above.any()) and bool((rows & ~above).any()):
            moves.append(f[above].mean(0) - f[rows & ~above].mean(0))
    if not moves:
        return None
    d = torch.stack(moves).mean(0)
    return d / d.norm() if float(d.norm()) > 0 else None


def direction_bonus(features: Tensor, group_ids: Tensor, direction: Tensor) -> Tensor:
    """[N]: each rollout's novelty (its feature minus its group's mean feature) projected on the unit
    `direction`, divided by the root mean square of the novelties' norms over the batch (0 when every rollout
    equals its group's mean)."""
    f = features.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(inv.max()) + 1, f.shape[1], dtype=f.dtype).index_add_(0, inv, f)
    counts = torch.zeros(int(inv.max()) + 1, dtype=f.dtype).index_add_(0, inv, torch.ones(len(f), dtype=f.dtype))
    novelty = f - (sums / counts[:, None])[inv]
    rms = float(novelty.square().sum(1).mean().sqrt())
    unit = direction.to(torch.float64) / direction.norm().clamp(min=1e-300)
    return novelty @ unit / rms if rms > 0 else torch.zeros(len(f), dtype=f.dtype)


@ADVANTAGES.register("dirl", grouped=True, whole_batch=True, features="hidden_mean")
def dirl(batch: Batch, features: Tensor | None = None, *, coef: NonNegative = 0.2, direction_path: str = "",
         scale_by_std: bool = True, eps: NonNegative = 1e-6) -> Tensor:
    """DiRL: GRPO on the reward plus a bonus for the part of a rollout's variation from its group that points
    along the reasoning direction (a penalty when it points against it).

    coef: weight of the direction bonus (in reward units: the bonus is the standardised projection)
    direction_path: a [D] reasoning direction saved by torch.save (empty: the batch's success direction)
    scale_by_std: divide by the group's std of the shaped reward (as GRPO)
    eps: added to that std before dividing

    DiRL extracts a reasoning-memorisation direction from the policy's representations, characterises each
    rollout's update by direction-weighted features and shapes the reward toward reasoning-aligned
    exploration. Here the features are the rollouts' mean last-layer hidden states (not gradient features);
    a rollout's novelty is its state minus its group's mean state; the bonus is coef x the novelty's
    projection on the direction / the batch's RMS novelty norm, added to the reward before GRPO's group
    normalisation. The direction is read from `direction_path` when given (e.g. the mean state on reasoning
    prompts minus that on recall prompts), else it is the batch's success direction: the mean, over groups
    with differing rewards, of the above-mean rollouts' mean state minus the others': our choices.
    """
    if features is None or features.dim() != 2 or features.shape[0] != batch.size:
        raise ConfigError("advantage 'dirl' needs each rollout's hidden-state features (the RL trainer computes them)")
    if batch.rewards is None:
        raise ConfigError("advantage 'dirl' needs batch.rewards (score the batch first)")
    r = batch.rewards.to(torch.float64)
    d = load_direction(direction_path) if direction_path else success_direction(features, r, batch.group_ids)
    if d is not None and d.shape[0] != features.shape[1]:
        raise ConfigError(f"advantage 'dirl' direction_path={direction_path}: a direction of {d.shape[0]} dimensions "
                          f"for hidden states of {features.shape[1]}")
    shaped = r if d is None else r + coef * direction_bonus(features, batch.group_ids, d)
    adv = group_normalize(shaped, batch.group_ids, scale_by_std=scale_by_std, eps=eps)
    return broadcast_to_tokens(adv, batch.loss_mask).float()
