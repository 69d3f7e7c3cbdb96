"""Rollout-shaping plugins: rollouts that stop, or restart, a sampled completion.
Each wraps the engine's plain `generate`; the batch is built by `groups_to_batch`."""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any, Sequence

import torch

from upslope.batch import Batch
from upslope.bounds import Count, Fraction
from upslope.data.types import Example
from upslope.engine import Completion, Engine, SamplingParams
from upslope.registry import ROLLOUTS
from upslope.rollout.plugin import groups_to_batch


def espo_stop(logprobs: Sequence[float], mu: float, sd: float, *, margin: float, min_tokens: int) -> int | None:
    """ESPO's stopping rule: the first token count t (>= min_tokens) at which the cumulative regret
    sum_{i<=t} (-logprob_i - mu) exceeds margin * sd * sqrt(t), or None when it never does."""
    total = 0.0
    for t, lp in enumerate(logprobs, 1):
        total += -lp - mu
        if t >= min_tokens and total > margin * sd * math.sqrt(t):
            return t
    return None


@ROLLOUTS.register("espo", train_only=True)
def espo_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                 params: SamplingParams, pad_id: int, group_offset: int = 0, *, margin: float = 3.0,
                 min_tokens: Count = 2, fail_reward: float = 0.0) -> Batch:
    """ESPO: stop a completion once its running regret (surprisal of the sampled tokens above the batch's
    mean) is significantly high, and give it a terminal failure reward.

    margin: stop when the cumulative regret exceeds margin x sd x sqrt(tokens) (sd: the batch's surprisal sd)
    min_tokens: never stop before this many tokens
    fail_reward: the reward of a stopped completion (an absorbing failure)

    The surrogate regret uses only the sampler's log-prob of each sampled token (what the HF engine's
    `output_scores` and vLLM's `SamplingParams(logprobs=0)` already return); its expected value is the
    mean surprisal over every token of this rollout call (the abstract leaves the estimator open). The
    completion is cut after generation, so this form saves learner tokens, not sampling time: reward
    components still score the full text (reward/<name> on stopped rows is the false-stop rate), while
    the combined reward is `fail_reward`.
    """
    groups = engine.generate(list(prompt_ids), params)
    lps = [lp for comps in groups for c in comps for lp in c.logprobs]
    mu = sum(-x for x in lps) / max(len(lps), 1)
    sd = math.sqrt(sum((-x - mu) ** 2 for x in lps) / max(len(lps) - 1, 1))
    out: list[list[Completion]] = []
    extra: list[dict[str, Any]] = []
    override: list[float] = []  # each completion's reward: fail_reward once stopped, else NaN (scored as usual)
    for comps in groups:
        kept = []
        for c in comps:
            t = espo_stop(c.logprobs, mu, sd, margin=margin, min_tokens=min_tokens)
            stopped = t is not None and t < len(c.token_ids)
            if stopped:
                kept.append(Completion(c.token_ids[:t], c.logprobs[:t], c.text, "early_stop"))
            else:
                kept.append(c)
            saved = len(c.token_ids) - t if stopped and t is not None else 0
            extra.append({"metrics": {"espo/stopped": float(stopped), "espo/saved_tokens": float(saved)}})
            override.append(fail_reward if stopped else math.nan)
        out.append(kept)
    batch = groups_to_batch(prompt_ids, examples, out, params, pad_id, engine.version, group_offset, extra)
    return replace(batch, reward_override=torch.tensor(override, dtype=torch.float32))


def noisy_prefix(tokens: Sequence[int], pool: Sequence[int], *, length: int, noise: float,
                 rng: random.Random) -> list[int]:
    """The first `length` tokens with each one replaced, with probability `noise`, by a token drawn from
    `pool` (tokens the policy itself produced for this prompt, so the noise stays in distribution)."""
    return [rng.choice(pool) if pool and rng.random() < noise else t for t in tokens[:length]]


@ROLLOUTS.register("denoise", train_only=True)
def denoise_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                    params: SamplingParams, pad_id: int, group_offset: int = 0, *, share: Fraction = 0.5,
                    prefix_frac: Fraction = 0.5, noise: Fraction = 0.5) -> Batch:
    """DenoiseRL: part of each group continues from a corrupted prefix of its own sample, so the policy
    learns to recover; the forced prefix is not trained on, the reward scores prefix + continuation.

    share: fraction of each group's completions (the last ones) restarted from a noisy prefix
    prefix_frac: the prefix is this fraction of the sampled completion's tokens (at least one)
    noise: probability that a prefix token is replaced by another token the group sampled

    The abstract leaves the noise open: here tokens are swapped for tokens of the same group's samples,
    so a prefix is plausible text that is likely wrong (for arithmetic: a wrong digit).
    """
    groups = engine.generate(list(prompt_ids), params)
    rng = random.Random(params.seed)
    restart_prompts, where, prefixes = [], [], []
    for g, comps in enumerate(groups):
        pool = [t for c in comps for t in c.token_ids]
        for j in range(len(comps) - round(share * len(comps)), len(comps)):
            toks = comps[j].token_ids
            length = min(max(1, int(prefix_frac * len(toks))), params.max_new_tokens - 1)
            if length < 1:
                continue
            prefix = noisy_prefix(toks, pool, length=length, noise=noise, rng=rng)
            restart_prompts.append(list(prompt_ids[g]) + prefix)
            where.append((g, j))
            prefixes.append(prefix)
    budget = max(params.max_new_tokens - max((len(p) for p in prefixes), default=0), 1)
    conts = engine.generate(restart_prompts, replace(params, n=1, max_new_tokens=budget)) if restart_prompts else []
    masks = {(g, j): [1] * len(c.token_ids) for g, comps in enumerate(groups) for j, c in enumerate(comps)}
    extra = {key: {"denoise_prefix": 0} for key in masks}
    for (g, j), prefix, [cont] in zip(where, prefixes, conts):
        text = (getattr(engine, "tokenizer", None).decode(prefix + cont.token_ids, skip_special_tokens=True)
                if hasattr(engine, "tokenizer") else cont.text)
        groups[g][j] = Completion(prefix + cont.token_ids, [0.0] * len(prefix) + cont.logprobs, text,
                                  cont.finish_reason)
        masks[(g, j)] = [0] * len(prefix) + [1] * len(cont.token_ids)
        extra[(g, j)] = {"denoise_prefix": len(prefix), "metrics": {"denoise/restarted": 1.0}}
    keys = [(g, j) for g, comps in enumerate(groups) for j in range(len(comps))]
    return groups_to_batch(prompt_ids, examples, groups, params, pad_id, engine.version, group_offset,
                           [extra[k] for k in keys], [masks[k] for k in keys])
