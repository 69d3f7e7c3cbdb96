"""What a run lends to the rewards that ask for it: a reward registered with `context=True` takes a
`context` argument (a RewardContext), so that it can check the policy's tokenizer or generate with
the run's own rollout engine without reaching for globals."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from upslope.engine import Engine


@dataclass(eq=False)
class RewardContext:
    """The run-time objects a reward may use. `policy_engine` is a function returning the run's
    rollout engine (started on first use), None where the run has none in this process (e.g.
    the Ray rollout workers generate elsewhere); `state` holds what a reward keeps for the run
    (e.g. the policy judge and its reply cache), and goes with the run."""

    policy_tokenizer: Any = None
    policy_engine: Callable[[], "Engine"] | None = None
    policy_stop_ids: list[int] = field(default_factory=list)
    state: dict[Any, Any] = field(default_factory=dict)
    step: int = 0  # the training step being scored (TRL-style rewards read it as trainer_state.global_step)
    total_steps: int = 0  # train.steps (trainer_state.max_steps)
