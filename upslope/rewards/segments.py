"""The `segmented` reward: a completion cut into consecutive segments (each ending at the first match
of its own pattern), each segment scored by its own reward, each score placed on the token where its
segment ends. SEAR scores a reasoning segment and an answer segment with competing rewards this way."""
from __future__ import annotations

import math
import re
from typing import Any, Literal

from upslope.errors import ConfigError
from upslope.registry import REWARDS
from upslope.rewards.context import RewardContext
from upslope.rewards.placement import PlacedReward

_KEYS = {"reward", "options", "end", "weight"}


def check_segments(segments: list[dict[str, Any]]) -> None:
    """One ConfigError line for segments that are not [{reward, options?, end?, weight?}, ...] with an
    `end` pattern on every segment but the last."""
    if len(segments) < 2:
        raise ConfigError(f"reward 'segmented': segments needs at least two entries (got {len(segments)})")
    for i, seg in enumerate(segments):
        unknown = sorted(set(seg) - _KEYS)
        if unknown or not isinstance(seg.get("reward"), str):
            raise ConfigError(f"reward 'segmented': segments[{i}] must be {{reward: NAME, options: {{...}}, end: "
                              f"REGEX, weight: W}} (got keys {sorted(seg)})")
        if not isinstance(seg.get("weight", 1.0), (int, float)) or isinstance(seg.get("weight"), bool):
            raise ConfigError(f"reward 'segmented': segments[{i}].weight must be a number (got {seg['weight']!r})")
        last = i == len(segments) - 1
        if last != ("end" not in seg):
            raise ConfigError(f"reward 'segmented': segments[{i}]: every segment but the last needs an 'end' "
                              f"pattern, and the last has none (it ends with the completion)")
        if not last:
            try:
                re.compile(seg["end"])
            except (re.error, TypeError) as exc:
                raise ConfigError(f"reward 'segmented': segments[{i}].end: not a regular expression ({exc})") from None


def segment_spans(text: str, ends: list[str]) -> list[tuple[int, int]]:
    """(start, end) of each segment: segment i ends after the first match of ends[i] at or after its
    start (or with the text when there is none); the last segment takes the rest. Spans may be empty."""
    spans, start = [], 0
    for pattern in ends:
        m = re.compile(pattern, re.DOTALL).search(text, start)
        end = m.end() if m else len(text)
        spans.append((start, end))
        start = end
    spans.append((start, len(text)))
    return spans


def segments_place_tokens(options: dict[str, Any]) -> bool:
    """The registry trait `places_tokens`: token placement (the default) puts rewards on tokens."""
    return options.get("placement", "token") == "token"


@REWARDS.register("segmented", batched=True, context=True, places_tokens=segments_place_tokens)
def segmented(completions: list[str], answers: list[Any], metas: list[dict], context: RewardContext | None = None,
              *, segments: list[dict[str, Any]], placement: Literal["token", "sequence"] = "token",
              empty_reward: float = 0.0) -> list[Any]:
    """Consecutive segments of a reply, each scored by its own reward and placed where the segment ends.

    segments: [{reward: NAME, options: {...}, end: REGEX, weight: W}, ...]: each segment ends after the first match of its end (the last with the reply); its score times its weight (default 1)
    placement: token (each segment's score on the token where it ends; needs gae or reinforce_pp) or sequence (their sum)
    empty_reward: the score of an empty segment (a reply whose boundary never comes: the later segments are empty)

    A segment's reward (any reward: a registered name or module:function) sees the segment's text
    as the completion, the sample's answer, and its meta with `segment` (the index) added; a
    segment whose score fails fails the sample (reward_fallback, counted). SEAR (Kim and Kumar 2026)
    trains one chain of thought whose reasoning segment is rewarded for exploring a risky route and
    whose answer segment is rewarded for a safe reply, with dense (process) rewards per segment: two
    segments split at the end of the reasoning, each with its reward, placed on its last token, so
    that a reward-to-go credits the reasoning tokens with both and the answer tokens with the
    answer's alone. The abstract leaves the rewards to the task; they are options here.
    """
    from upslope.config import RewardSpec
    from upslope.rewards import build_reward_fns, score

    check_segments(segments)
    ends = [seg["end"] for seg in segments[:-1]]
    spans = [segment_spans(c, ends) for c in completions]
    parts: list[list[tuple[int, float]]] = [[] for _ in completions]
    for k, seg in enumerate(segments):
        fns = build_reward_fns([RewardSpec(name=seg["reward"], options=seg.get("options") or {})], context=context)
        live = [i for i, s in enumerate(spans) if s[k][1] > s[k][0]]
        result = score(fns, [completions[i][slice(*spans[i][k])] for i in live], [answers[i] for i in live],
                       [{**metas[i], "segment": k} for i in live], fallback=math.nan)
        values = dict(zip(live, next(iter(result.components.values()), [])))
        weight = float(seg.get("weight", 1.0))
        for i, s in enumerate(spans):
            parts[i].append((s[k][1], weight * values.get(i, empty_reward)))
    out: list[Any] = []
    for p in parts:
        if any(not math.isfinite(v) for _, v in p):
            out.append(math.nan)
        else:
            out.append(PlacedReward(tuple(p)) if placement == "token" else sum(v for _, v in p))
    return out
