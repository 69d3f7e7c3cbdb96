"""The `process` reward: a completion split into steps (by a delimiter), each step scored by a
step reward, the step scores aggregated (min, mean or last) into the sequence reward.

The step reward is any reward (a registered name such as `reward_model`, `llm_judge` or
`format`, or a user function `module:function`) with its own options. It sees each step as
the completion: with `prefix: true` (the default, as process reward models are trained) the
text up to and including the step, else the step alone; the sample's answer and meta (with
`step` and `steps` added) are passed along. A step whose score fails makes the whole sample
fail (reward_fallback, counted)."""
from __future__ import annotations

import math
from typing import Any, Literal, Sequence

from upslope.registry import REWARDS


def split_steps(text: str, delimiter: str) -> list[str]:
    """The non-blank steps of `text` between delimiters, each with its delimiter kept, so that
    the steps joined give the text back (up to blank steps); a text with no step gives [text]."""
    parts = text.split(delimiter) if delimiter else [text]
    steps = [p + delimiter for p in parts[:-1]] + [parts[-1]]
    kept = [s for s in steps if s.strip()]
    return kept or [text]


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


@REWARDS.register("process", batched=True)
def process_reward(completions: list[str], answers: list[Any], metas: list[dict], *, step_reward: str,
                   step_options: dict[str, Any] | None = None, delimiter: str = "\n",
                   aggregate: Literal["min", "mean", "last"] = "min", prefix: bool = True,
                   max_steps: int = 64) -> list[float]:
    """Per-step scores (steps split by a delimiter) aggregated into the sequence reward.

    step_reward: the reward scoring each step: a registered name (reward_model, llm_judge, format...) or module:function
    step_options: that reward's options
    delimiter: what separates steps (default a newline; e.g. '\\n\\n' or 'Step')
    aggregate: min, mean or last step score
    prefix: score the text up to and including each step (true) or each step alone
    max_steps: steps past this many are merged into the last one
    """
    from upslope.config import RewardSpec
    from upslope.rewards import build_reward_fns, score

    fns = build_reward_fns([RewardSpec(name=step_reward, options=step_options or {})])
    texts, owners, step_answers, step_metas = [], [], [], []
    for i, (c, a, m) in enumerate(zip(completions, answers, metas)):
        steps = split_steps(c, delimiter)
        if len(steps) > max_steps:
            steps = steps[:max_steps - 1] + ["".join(steps[max_steps - 1:])]
        done = ""
        for k, s in enumerate(steps):
            done += s
            texts.append(done if prefix else s)
            owners.append(i)
            step_answers.append(a)
            step_metas.append({**m, "step": k, "steps": len(steps)})
    result = score(fns, texts, step_answers, step_metas, fallback=math.nan)
    per_step = next(iter(result.components.values()), [math.nan] * len(texts))
    grouped: list[list[float]] = [[] for _ in completions]
    for owner, v in zip(owners, per_step):
        grouped[owner].append(v)
    return [math.nan if any(not math.isfinite(v) for v in g) else aggregate_steps(g, aggregate) for g in grouped]
