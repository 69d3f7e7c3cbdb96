"""Hypothesis strategies and builders for the algorithm tests: small random Batches."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from upslope.batch import Batch, build_batch

REWARD = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-3, 3, allow_nan=False, width=32))


def make_batch(groups: list[list[float]], comp_lens: list[int], prompt_lens: list[int] | None = None,
               loss_masks: list[list[int]] | None = None, truncated: list[bool] | None = None) -> Batch:
    """A Batch with one row per reward; rows grouped as in `groups` (list of per-group rewards)."""
    rewards = [r for g in groups for r in g]
    gids = [i for i, g in enumerate(groups) for _ in g]
    n = len(rewards)
    prompt_lens = prompt_lens or [2] * n
    batch = build_batch(
        prompt_ids=[[7] * p for p in prompt_lens],
        completion_ids=[[5] * c for c in comp_lens],
        completion_logprobs=[[-0.5] * c for c in comp_lens],
        group_ids=gids,
        truncated=truncated or [False] * n,
        pad_id=0,
        completion_loss_masks=loss_masks,
    )
    batch.rewards = torch.tensor(rewards, dtype=torch.float32)
    return batch


@st.composite
def batches(draw, full_mask: bool = False, max_groups: int = 4, max_group: int = 5, max_len: int = 6) -> Batch:
    """Random grouped batch; with full_mask every row has >= 1 completion token, all trained."""
    groups = draw(st.lists(st.lists(REWARD, min_size=1, max_size=max_group), min_size=1, max_size=max_groups))
    n = sum(len(g) for g in groups)
    lo = 1 if full_mask else 0
    comp = draw(st.lists(st.integers(lo, max_len), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    masks = None
    if not full_mask:
        masks = [draw(st.lists(st.sampled_from([0, 1, 1]), min_size=c, max_size=c)) for c in comp]
    trunc = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return make_batch(groups, comp, prompts, masks, trunc)


def sample_values(adv: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The per-sample advantage from a [N, L] broadcast one (first completion token of each row)."""
    return adv[torch.arange(batch.size), batch.prompt_lens]


@st.composite
def token_tensors(draw, max_rows: int = 4, max_len: int = 6):
    """(logprobs, old_logprobs, advantages, mask) [N, L] with bounded log-ratios."""
    n = draw(st.integers(1, max_rows))
    L = draw(st.integers(1, max_len))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, L, generator=g, dtype=torch.float64) * 3
    old = lp + (torch.rand(n, L, generator=g, dtype=torch.float64) - 0.5) * 1.6
    adv = torch.randn(n, L, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, L, generator=g) < 0.75).to(torch.float64)
    return lp, old, adv, mask


def bind_loss(name: str, options: dict | None = None):
    """A policy loss bound with its options, called as the RL objective calls it: a `token_stats` loss
    also gets the forward's entropy (0.2 nats everywhere) and a uniform top-k (its `top_k` trait)."""
    import math

    from upslope.registry import POLICY_LOSSES

    fn, traits = POLICY_LOSSES.bind(name, options), POLICY_LOSSES.get(name).traits
    if not traits.token_stats:
        return fn
    k = traits.top_k or 2

    def with_stats(lp, old, adv, mask, **kw):
        stats = {"entropy": torch.full_like(lp, 0.2), "topk_logprobs": torch.full((*lp.shape, k), -math.log(k))}
        return fn(lp, old, adv, mask, **stats, **kw)

    return with_stats


def bind_advantage(name: str, batch: Batch, generator: torch.Generator):
    """An advantage estimator called as the RL trainer calls it: one declaring a `salience` source also
    gets a random non-negative per-token salience, one declaring a `features` source random features (per
    rollout, or per position for `hidden_states`)."""
    import functools

    from upslope.registry import ADVANTAGES

    fn = ADVANTAGES.bind(name)
    if ADVANTAGES.get(name).traits.salience:
        fn = functools.partial(fn, salience=torch.rand(batch.input_ids.shape, generator=generator))
    if ADVANTAGES.get(name).traits.features:
        per_position = ADVANTAGES.get(name).traits.features == "hidden_states"
        shape = (*batch.input_ids.shape, 16) if per_position else (batch.size, 16)
        fn = functools.partial(fn, features=torch.randn(*shape, generator=generator))
    return fn
