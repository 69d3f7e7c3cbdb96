"""Length-shaping rewards."""
from typing import Any

from upslope.bounds import Count, NonNegative
from upslope.errors import DataError
from upslope.registry import REWARDS


@REWARDS.register("overlong_penalty")
def overlong_penalty(completion: str, answer: Any, meta: dict, *, max_length: Count = 0, buffer: Count = 0) -> float:
    """DAPO soft overlong penalty: 0 up to max - buffer tokens, linear to -1 at max, -1 beyond.

    max_length: length limit in tokens (0: meta max_new_tokens, the rollout's)
    buffer: tokens before the limit over which the penalty ramps from 0 to -1 (0..max)

    Reads meta["completion_tokens"]; max is `max_length`, or meta["max_new_tokens"] when 0.
    """
    if "completion_tokens" not in meta:
        raise DataError("reward 'overlong_penalty' needs meta['completion_tokens'] (the number of generated tokens)")
    n = int(meta["completion_tokens"])
    limit = int(max_length) or int(meta.get("max_new_tokens") or 0)
    if limit <= 0:
        raise DataError("reward 'overlong_penalty' needs max_length > 0 or meta['max_new_tokens']")
    buffer = max(0, min(int(buffer), limit))
    if n <= limit - buffer:
        return 0.0
    if n <= limit:
        return (limit - buffer - n) / buffer
    return -1.0


@REWARDS.register("suco_length", batched=True)
def suco_length(completions: list[str], answers: list[Any], metas: list[dict], *, verifier_name: str = "integer",
                verifier_options: dict[str, Any] | None = None, slack: NonNegative = 1.0, over_coef: NonNegative = 1.0,
                under_coef: NonNegative = 1.0) -> list[float]:
    """SuCo-style sufficiency reward: penalise right replies over their group's sufficient length, wrong ones under it.

    verifier_name: registered reward deciding correctness (0/1) of each reply
    verifier_options: options of that reward (e.g. {extract: first})
    slack: the sufficient length is the group's shortest right reply times 1 + slack * (1 - group accuracy) (>= 0)
    over_coef: weight of the over-thinking penalty (n - target) / n on a right reply (>= 0)
    under_coef: weight of the under-thinking penalty (target - n) / target on a wrong reply (>= 0)

    A length-shaping component to add beside the correctness reward; in [-max coef, 0].
    Groups are the replies to one prompt (meta example_id); lengths are meta completion_tokens.
    SuCo's minimal sufficient CoT is the shortest prefix that still yields the right answer;
    finding it needs extra decoding, so the group's shortest right reply stands in for it and
    the tolerance grows as the group's accuracy falls (harder problems may think longer: the
    abstract's difficulty-scaled threshold). A group with no right reply is not shaped. The
    proxy and the scaling are our choices.
    """
    from upslope.rewards.calibration import verifier

    if min(slack, over_coef, under_coef) < 0:
        raise DataError(f"reward 'suco_length': slack, over_coef and under_coef must be >= 0 "
                        f"(got {slack}, {over_coef}, {under_coef})")
    check = verifier(verifier_name, verifier_options, "suco_length")
    right = [check(c, a, m) > 0 for c, a, m in zip(completions, answers, metas)]
    lengths = []
    for m in metas:
        if "completion_tokens" not in m:
            raise DataError("reward 'suco_length' needs meta['completion_tokens'] (the number of generated tokens)")
        lengths.append(max(int(m["completion_tokens"]), 1))
    groups: dict[Any, list[int]] = {}
    for i, m in enumerate(metas):
        groups.setdefault(m.get("example_id", ("sample", i)), []).append(i)
    out = [0.0] * len(completions)
    for members in groups.values():
        ok = [lengths[i] for i in members if right[i]]
        if not ok:
            continue
        target = min(ok) * (1 + slack * (1 - len(ok) / len(members)))
        for i in members:
            n = lengths[i]
            if right[i] and n > target:
                out[i] = -over_coef * (n - target) / n
            elif not right[i] and n < target:
                out[i] = -under_coef * (target - n) / target
    return out
