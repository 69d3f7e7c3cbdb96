"""OPERA's intrinsic reward: how much a reply's uncertainty falls across its reflective steps, read
from the sampler's own token log-probs (no judge, no second forward)."""
from __future__ import annotations

import re
from typing import Any, Literal

from upslope.bounds import PositiveCount, Regex
from upslope.errors import ConfigError
from upslope.registry import REWARDS
from upslope.rewards.context import RewardContext
from upslope.rewards.placement import char_end_tokens

_REFLECTIVE = r"\b(?:wait|hmm|however|alternatively|let me check|let me verify|double-check|on second thought)\b"


def uncertainty_drops(logprobs: list[float], points: list[int], window: int) -> list[float]:
    """At each reflective token index t: mean NLL of the `window` tokens before t minus mean NLL of the
    `window` tokens from t on (positive: the reply grew surer after reflecting); a point with no token
    on either side is skipped."""
    drops = []
    for t in points:
        before, after = logprobs[max(0, t - window):t], logprobs[t:t + window]
        if before and after:
            drops.append(-sum(before) / len(before) + sum(after) / len(after))
    return drops


@REWARDS.register("opera", batched=True, context=True, logprobs=True)
def opera(completions: list[str], answers: list[Any], metas: list[dict], context: RewardContext | None = None,
          token_ids: list[list[int]] | None = None, logprobs: list[list[float]] | None = None, *,
          reflective: Regex = _REFLECTIVE, window: PositiveCount = 8, aggregate: Literal["mean", "sum"] = "mean",
          scale: float = 1.0) -> list[float]:
    """OPERA: reward the drop in perplexity (mean token NLL, nats) from before to after each reflective step.

    reflective: regular expression (case-insensitive) of a reflective cue (wait, hmm, let me check, ...)
    window: tokens on each side of a cue whose mean NLL is compared
    aggregate: mean or sum of the drops over a reply's cues
    scale: multiplies the reward (its sign too: negative rewards rising uncertainty)

    A reply with no cue, or whose tokens do not decode to its text, earns 0. The log-probs are the
    sampler's (batch.sampler_logprobs), so the signal costs nothing beyond the rollout. OPERA (Jiang et
    al. 2026) derives an intrinsic reward from perplexity dynamics that quantifies uncertainty reduction
    at critical reflective states; the cue list, the window and the difference of mean NLLs are our
    choices. Its perplexity-prioritised rollouts are the `darts` filter with length_coef 0 (keep the
    rollouts of lowest perplexity per group; recipes/opera.yaml).
    """
    if not completions:
        return []
    tokenizer = (context or RewardContext()).policy_tokenizer
    if tokenizer is None or token_ids is None or logprobs is None:
        raise ConfigError("reward 'opera' needs the policy's tokenizer and the sampler's log-probs (the reward stage "
                          "of a training run or an evaluation gives both)")
    out = []
    for text, ids, lps in zip(completions, token_ids, logprobs):
        starts = [m.start() + 1 for m in re.finditer(reflective, text, re.IGNORECASE)]
        points = char_end_tokens(tokenizer, ids, text, starts) if starts else None
        drops = uncertainty_drops(lps, sorted(set(points)), window) if points else []
        total = sum(drops) / len(drops) if drops and aggregate == "mean" else sum(drops)
        out.append(scale * total)
    return out
