"""The stages of one training step after the rollout, each a plain function over the Batch:
reward -> filter -> (overlong mask, advantage) -> metrics. (The rollout plugins live in
`upslope.rollout`; the update and the weight sync in the learner.)"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from upslope.batch import Batch
from upslope.errors import UpslopeError
from upslope.rewards import RewardFn, score, status_counts
from upslope.rewards.placement import placed_token_rewards


def score_batch(batch: Batch, reward_fns: Sequence[RewardFn], combiner: Callable[..., torch.Tensor],
                fallback: float, tokenizer: Any = None) -> tuple[Batch, dict[str, float], dict[str, str]]:
    """Score each completion with every reward: a Batch with named components and the combined
    reward, its metrics, and each failing reward's first error (a round is checked once whole, see
    `check_reward_failures`). Given the policy's `tokenizer`, a reward placed inside completions (a
    PlacedReward, e.g. the process reward's step scores) also sets batch.token_rewards."""
    texts = [m["completion"] for m in batch.meta]
    answers = [m["answer"] for m in batch.meta]
    ids = completion_token_ids(batch) if any(rf.token_ids for rf in reward_fns) else None
    result = score(reward_fns, texts, answers, batch.meta, fallback, token_ids=ids)
    components = {k: torch.tensor(v, dtype=torch.float32) for k, v in result.components.items()}
    combined = combiner(components, batch.group_ids, weights=result.weights).float()
    # a rollout may shape a sample's reward: batch.reward_scale multiplies it, batch.reward_override replaces it
    n = batch.size
    scale = batch.reward_scale if batch.reward_scale is not None else torch.ones(n)
    override = batch.reward_override if batch.reward_override is not None else torch.full((n,), float("nan"))
    combined = torch.where(override.isnan(), combined * scale, override) if n else combined
    batch = replace(batch, reward_components=components, rewards=combined)
    metrics: dict[str, float] = {}
    if tokenizer is not None and any(rf.places_tokens for rf in reward_fns):
        token_rewards, unplaced = placed_token_rewards(batch, result.placed, result.weights, tokenizer, scale, override)
        batch = replace(batch, token_rewards=token_rewards)
        metrics["token_rewards/unplaced"] = float(unplaced)
    metrics.update({f"reward_failures/{k}": float(v) for k, v in result.failures.items()})
    metrics.update({f"reward_not_applicable/{k}": float(v) for k, v in result.not_applicable.items()})
    metrics.update({f"sandbox/{k}": float(v) for k, v in status_counts(batch.meta).items()})
    return batch, metrics, result.errors


def completion_token_ids(batch: Batch) -> list[list[int]]:
    """Each sample's completion tokens (what the policy generated, padding cut off)."""
    return [batch.input_ids[i, int(p):int(e)].tolist()
            for i, (p, e) in enumerate(zip(batch.prompt_lens.tolist(), batch.seq_lens.tolist()))]


def check_reward_failures(metrics: dict[str, float], errors: dict[str, str], size: int) -> None:
    """A reward that failed on every one of `size` (> 1) samples is an error (`metrics` counts the failures)."""
    for name, error in errors.items():
        if metrics.get(f"reward_failures/{name}", 0.0) == size and size > 1:
            raise UpslopeError(f"reward '{name}' failed on every sample of this batch ({error}); "
                               f"fix the reward function (failures on some samples get reward_fallback instead)")


def apply_filters(batch: Batch, filters: Sequence[Callable[[Batch], torch.Tensor]]) -> Batch:
    """Keep the samples every filter keeps (filters keep or drop whole groups)."""
    keep = torch.ones(batch.size, dtype=torch.bool)
    for f in filters:
        keep &= f(batch)
    return batch if bool(keep.all()) else batch.select(torch.nonzero(keep).flatten())


def mask_truncated(batch: Batch) -> Batch:
    """DAPO overlong filtering: completions cut at max_new_tokens train on nothing."""
    from upslope.algos.filters import overlong_mask

    return replace(batch, loss_mask=overlong_mask(batch))


def advantage(batch: Batch, fn: Callable[[Batch], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]) -> Batch:
    """The batch with per-token advantages from the estimator `fn`, zero off the trained tokens; a
    `critic=True` estimator's (advantages, returns) sets both."""
    out, returns = fn(batch), batch.returns
    if isinstance(out, tuple):
        out, returns = out
    bonus = batch.advantage_bonus  # a rollout's per-token additions (the agent's interleaved SFT term)
    if bonus is None:
        bonus = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    return replace(batch, advantages=(out.float() + bonus) * batch.loss_mask, returns=returns)


def meta_metrics(metas: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Means over the samples of the numbers a rollout put in meta["metrics"] (e.g. agent/turns)."""
    sums: dict[str, float] = {}
    for m in metas:
        for k, v in m.get("metrics", {}).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    return {k: v / len(metas) for k, v in sums.items()}


def zero_variance_fraction(batch: Batch) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal); 0 for an unscored batch."""
    if batch.rewards is None:
        return 0.0
    flat = 0
    groups = batch.group_ids.unique()
    for g in groups:
        r = batch.rewards[batch.group_ids == g]
        flat += int(bool((r == r[0]).all()))
    return flat / max(len(groups), 1)


def rollout_metrics(batch: Batch) -> dict[str, Any]:
    lens = batch.completion_lens.float()
    out: dict[str, Any] = {
        "reward/mean": float(batch.rewards.mean()) if batch.rewards is not None else 0.0,
        "reward/std": float(batch.rewards.std()) if batch.rewards is not None and batch.size > 1 else 0.0,
        "length/mean": float(lens.mean()),
        "length/max": float(lens.max()),
        "length/truncated_frac": float(batch.truncated.float().mean()),
        "groups/zero_variance_frac": zero_variance_fraction(batch),
    }
    out.update(meta_metrics(batch.meta))
    for i, (name, v) in enumerate(batch.reward_components.items()):
        out[f"reward/{name}"] = float(v.mean())
        if i == 0:  # the first component decides correctness, as in evaluation
            out["accuracy"] = float((v >= 0.5).float().mean())
    if len(batch.reward_components) > 1:  # what per-component group normalisation (GDPO) sees
        from upslope.algos.common import group_normalize

        for name, v in batch.reward_components.items():
            z = group_normalize(v.float(), batch.group_ids)
            out[f"adv_component/{name}/mean_abs"] = float(z.abs().mean())
    if batch.advantages is not None:
        m = batch.loss_mask > 0
        adv = batch.advantages[m]
        if adv.numel():
            out.update({"adv/mean": float(adv.mean()), "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0,
                        "adv/min": float(adv.min()), "adv/max": float(adv.max())})
    return out
