"""The collect stage every sampling method shares: draw prompts -> rollout -> reward -> keep,
in resampling rounds until enough groups are kept. Online RL keeps what its filters keep,
on-policy DPO keeps best/worst pairs, RFT, distillation and evaluation keep everything.

Where the groups come from is a `RoundRollout`: the run's rollout plugin on this process's engine
(`on_engine`), or the Ray rollout workers' jobs (`upslope.train.pipeline`), which may hand a round
over in pieces as its jobs finish."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from upslope.batch import Batch, concat, in_group_order
from upslope.data.types import Example
from upslope.engine import Engine, SamplingParams
from upslope.rewards import RewardFn
from upslope.rollout.plugin import RolloutFn
from upslope.seeding import seed_everything
from upslope.train import stages
from upslope.train.timing import StageClock

# a round's prompts, examples, sampling parameters and first group id -> its groups, in one or more pieces
RoundRollout = Callable[[list[list[int]], list[Example], SamplingParams, int], Iterable[Batch]]
Draw = Callable[[int], Sequence[int]]  # k -> k prompt indices
Keep = Callable[[Batch], Batch]  # a scored piece of whole groups -> the groups kept


@dataclass
class Task:
    """What a method samples from and how it scores: encoded prompts, their examples, rewards."""

    prompt_ids: list[list[int]]
    examples: list[Example]
    reward_fns: list[RewardFn] = field(default_factory=list)  # empty: no reward stage (e.g. distillation)
    combiner: Callable[..., torch.Tensor] | None = None
    fallback: float = 0.0
    tokenizer: Any = None  # the policy's: places rewards inside completions as token rewards (None: not placed)
    pad_id: int = 0  # the tokenizer's pad id: what batches of this task are padded with
    strict_rewards: bool = True  # a reward that fails on every sample of a round is an error (evaluation: no)


@dataclass(frozen=True)
class Rounds:
    """How `collect` draws and when it stops: `want` groups kept, `per_round` prompts drawn in the
    first round (default `want`), later rounds drawing the missing groups (`refill`) or `per_round`
    again, at most 1 + `max_rounds` rounds. With `merge_repeats`, a prompt drawn k times in one round
    is one group of k x n rollouts (the sampler's trait: CERO). With `reseed`, every RNG is seeded
    with it at the start of each round, as the training loop seeds each step."""

    want: int
    per_round: int | None = None
    refill: bool = True
    max_rounds: int = 0
    merge_repeats: bool = False
    reseed: int | None = None

    @property
    def first(self) -> int:
        """Prompts drawn in the first round."""
        return self.per_round or self.want


@dataclass
class Collected:
    """The kept batch (at most `want` groups), everything sampled, and what was counted on the way."""

    batch: Batch
    seen: Batch
    metrics: dict[str, Any]
    indices: list[int]  # the prompt index of each group id, over every round
    kept_groups: int  # groups kept over every round (may exceed `want`; the batch is cut to `want`); draws if merged
    dropped: int  # groups the keep step removed (draws, with merge_repeats)

    @property
    def drawn(self) -> int:
        """Prompts drawn over every round."""
        return len(self.indices)


def on_engine(engine: Engine, rollout: RolloutFn, pad_id: int) -> RoundRollout:
    """The rollout plugin on this process's engine, a round in one piece (generated when asked for)."""
    def whole_round(prompts: list[list[int]], examples: list[Example], params: SamplingParams,
                    group_offset: int) -> Iterator[Batch]:
        yield rollout(engine, prompts, examples, params, pad_id, group_offset=group_offset)
    return whole_round


def joined(pieces: RoundRollout, pad_id: int) -> RoundRollout:
    """Pieces joined into one: the whole round, in group order, once every piece has arrived."""
    def whole(*args: Any) -> Iterator[Batch]:
        yield in_group_order(list(pieces(*args)), pad_id)
    return whole


def merge_repeated_prompts(batch: Batch, idx: Sequence[int], offset: int) -> Batch:
    """The round's batch with every repeat of a prompt index in `idx` given the group id of its first
    draw (offset + first position), so grouped advantages compare all of that prompt's rollouts."""
    first: dict[int, int] = {}
    remap = torch.tensor([first.setdefault(i, offset + g) for g, i in enumerate(idx)], dtype=torch.long)
    return replace(batch, group_ids=remap[batch.group_ids - offset])


def collect(task: Task, rollout: RoundRollout, draw: Draw, params: SamplingParams, rounds: Rounds,
            keep: Keep | None = None, *, clock: StageClock | None = None,
            on_kept: Callable[[Batch], None] | None = None) -> Collected:
    """Rounds of: `draw(k)` prompt indices, `rollout` with `params` (round r samples with seed + r),
    reward, then `keep` (default: keep all), until `rounds.want` groups are kept or the rounds run out
    (see `Rounds`). Group ids are unique across rounds.

    A round may arrive in pieces of whole groups (the Ray workers' jobs, as they finish): each is
    rewarded and kept on arrival and what it keeps goes to `on_kept` at once (the streamed update;
    with `refill`, every kept group is in the batch), so the reward and the keep step must be per
    group; a round's pieces are joined in group order, as one rollout would return them. A prompt's
    repeats may arrive in different pieces, so `merge_repeats` takes each round whole."""
    if on_kept is not None and not rounds.refill:
        raise ValueError("collect: on_kept needs refill (without it the batch is cut to `want` groups at the end)")
    if on_kept is not None and rounds.merge_repeats:
        raise ValueError("collect: on_kept cannot stream merged repeats (a prompt's group spans pieces)")
    clock = clock or StageClock()
    pad_id, want = task.pad_id, rounds.want
    seen: list[Batch] = []
    kept: list[Batch] = []
    metrics: dict[str, Any] = {}
    groups = dropped = 0
    indices: list[int] = []
    generate = joined(rollout, pad_id) if rounds.merge_repeats else rollout
    for round_ in range(rounds.max_rounds + 1):
        idx = list(draw(want - groups if round_ and rounds.refill else rounds.first))
        offset = len(indices)
        if rounds.reseed is not None:
            seed_everything(rounds.reseed)
        round_params = params if round_ == 0 or params.seed is None else replace(params, seed=params.seed + round_)
        parts = iter(generate([task.prompt_ids[i] for i in idx], [task.examples[i] for i in idx], round_params, offset))
        scored, kept_now, round_metrics, errors = [], [], {}, {}
        round_kept = 0
        while True:
            with clock("rollout"):
                b = next(parts, None)
            if b is None:
                break
            if rounds.merge_repeats:
                b = merge_repeated_prompts(b, idx, offset)
            if task.reward_fns:
                with clock("reward"):
                    b, m, e = stages.score_batch(b, task.reward_fns, task.combiner, task.fallback, task.tokenizer)
                for k, v in m.items():
                    round_metrics[k] = round_metrics.get(k, 0.0) + v
                for k, v in e.items():
                    errors.setdefault(k, v)
            scored.append(b)
            b = keep(b) if keep is not None else b
            if b.size:
                kept_ids = b.group_ids.unique().tolist()
                # a merged group counts once per draw it holds: `want` stays a budget of draws of n rollouts
                round_kept += (sum(idx.count(idx[g - offset]) for g in kept_ids) if rounds.merge_repeats
                               else len(kept_ids))
                kept_now.append(b)
                if on_kept is not None:
                    on_kept(b)
        size = sum(b.size for b in scored)
        if task.strict_rewards:
            stages.check_reward_failures(round_metrics, errors, size)
        for k, v in round_metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v
        indices += idx
        seen.append(in_group_order(scored, pad_id))
        dropped += len(idx) - round_kept
        if kept_now:
            kept.append(in_group_order(kept_now, pad_id))
            groups += round_kept
        if groups >= want:
            break
    everything = concat(seen, pad_id)
    metrics.update(stages.rollout_metrics(everything))
    metrics["rollout/generated_tokens"] = float(everything.completion_lens.sum())
    metrics["rollout/prompts_drawn"] = float(len(indices))
    batch = concat(kept, pad_id) if kept else everything.select([])
    if batch.size and batch.num_groups > want:
        first = batch.group_ids.unique()[:want]
        batch = batch.select(torch.nonzero(torch.isin(batch.group_ids, first)).flatten())
    return Collected(batch, everything, metrics, indices, groups, dropped)
