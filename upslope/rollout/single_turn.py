"""The default rollout (`rollout.kind: single_turn`): n completions per prompt in one engine call."""
from __future__ import annotations

from typing import Sequence

from upslope.batch import Batch
from upslope.data.types import Example
from upslope.registry import ROLLOUTS
from upslope.rollout.base import Engine, SamplingParams
from upslope.rollout.plugin import groups_to_batch


@ROLLOUTS.register("single_turn")
def single_turn(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example], params: SamplingParams,
                pad_id: int, group_offset: int = 0) -> Batch:
    """n completions per prompt through the engine, as a Batch (one group per prompt)."""
    return groups_to_batch(prompt_ids, examples, engine.generate(list(prompt_ids), params), params, pad_id,
                           engine.version, group_offset)
