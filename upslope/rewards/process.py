"""The `process` reward: a completion split into steps (by a delimiter), each step scored by a
step reward, the step scores aggregated (min, mean or last) into the sequence reward, or placed
as token rewards at the step ends.

The step reward is any reward (a registered name such as `reward_model`, `llm_judge` or
`format`, or a user function `module:function`) with its own options. It sees each step as
the completion: with `prefix: true` (the default, as process reward models are trained) the
text up to and including the step, else the step alone; the sample's answer and meta (with
`step` and `steps` added) are passed along. A step whose score fails makes the whole sample
fail (reward_fallback, counted). With `placement: token` each step's score is a token reward on
the token where the step (its delimiter included) ends, and the sequence reward is their sum: for
the advantage estimators that take token rewards (gae, reinforce_pp)."""
from __future__ import annotations

import math
from typing import Any, Literal, Sequence

from upslope.bounds import PositiveCount
from upslope.registry import REWARDS
from upslope.rewards.context import RewardContext
from upslope.rewards.placement import PlacedReward


def step_spans(text: str, delimiter: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the non-blank steps of `text`, each ending after its
    delimiter; a text with no non-blank step is one span, the whole text."""
    spans, start = [], 0
    while delimiter:
        at = text.find(delimiter, start)
        end = len(text) if at < 0 else at + len(delimiter)
        if text[start:end].strip():
            spans.append((start, end))
        if at < 0:
            break
        start = end
    return spans or [(0, len(text))]


def split_steps(text: str, delimiter: str) -> list[str]:
    """The non-blank steps of `text` between delimiters, each with its delimiter kept, so that
    the steps joined give the text back (up to blank steps); a text with no step gives [text]."""
    return [text[s:e] for s, e in step_spans(text, delimiter)]


def aggregate_steps(scores: Sequence[float], how: str) -> float:
    """min (a chain is as good as its worst step), mean, or last (the final step's score)."""
    if not scores:
        return math.nan
    if how == "min":
        return min(scores)
    if how == "mean":
        return sum(scores) / len(scores)
    if how == "last":
        return scores[-1]
    raise ValueError(f"unknown aggregation {how!r}")


def placement_is_token(options: dict[str, Any]) -> bool:
    """The registry trait `places_tokens`: whether these options put rewards on tokens."""
    return options.get("placement") == "token"


@REWARDS.register("process", batched=True, context=True, places_tokens=placement_is_token)
def process_reward(completions: list[str], answers: list[Any], metas: list[dict],
                   context: RewardContext | None = None, *, step_reward: str,
                   step_options: dict[str, Any] | None = None, delimiter: str = "\n",
                   aggregate: Literal["min", "mean", "last"] = "min", prefix: bool = True,
                   max_steps: PositiveCount = 64, placement: Literal["sequence", "token"] = "sequence") -> list[Any]:
    """Per-step scores (steps split by a delimiter) aggregated into the sequence reward, or placed at step ends.

    step_reward: the reward scoring each step: a registered name (reward_model, llm_judge, format...) or module:function
    step_options: that reward's options
    delimiter: what separates steps (default a newline; e.g. '\\n\\n' or 'Step')
    aggregate: placement sequence: min, mean or last step score
    prefix: score the text up to and including each step (true) or each step alone
    max_steps: steps past this many are merged into the last one
    placement: sequence (the aggregate) or token (each step's score on the token where the step ends; needs gae or reinforce_pp)
    """
    from upslope.config import RewardSpec
    from upslope.rewards import build_reward_fns, score

    fns = build_reward_fns([RewardSpec(name=step_reward, options=step_options or {})], context=context)
    texts, owners, ends, step_answers, step_metas = [], [], [], [], []
    for i, (c, a, m) in enumerate(zip(completions, answers, metas)):
        spans = step_spans(c, delimiter)
        if len(spans) > max_steps:
            spans = spans[:max_steps - 1] + [(spans[max_steps - 1][0], spans[-1][1])]
        for k, (start, end) in enumerate(spans):
            texts.append(c[:end] if prefix else c[start:end])
            owners.append(i)
            ends.append(end)
            step_answers.append(a)
            step_metas.append({**m, "step": k, "steps": len(spans)})
    result = score(fns, texts, step_answers, step_metas, fallback=math.nan)
    per_step = next(iter(result.components.values()), [math.nan] * len(texts))
    grouped: list[list[tuple[int, float]]] = [[] for _ in completions]
    for owner, end, v in zip(owners, ends, per_step):
        grouped[owner].append((end, v))
    out: list[Any] = []
    for g in grouped:
        scores = [v for _, v in g]
        if any(not math.isfinite(v) for v in scores):
            out.append(math.nan)
        else:
            out.append(PlacedReward(tuple(g)) if placement == "token" else aggregate_steps(scores, aggregate))
    return out
