"""Length-shaping rewards."""
from typing import Any

from upslope.errors import DataError
from upslope.registry import REWARDS


@REWARDS.register("overlong_penalty")
def overlong_penalty(completion: str, answer: Any, meta: dict, *, max_length: int = 0, buffer: int = 0) -> float:
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
