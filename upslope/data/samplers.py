"""Prompt samplers: which prompts each step trains on. State is saved in checkpoints so a
resumed run draws exactly the prompts the uninterrupted run would have drawn.

A sampler plugin is a class registered in `SAMPLERS`, built as
`cls(num_prompts, seed, shuffle, *, options)` (`data.sampler` names it and gives the
options; `shuffle` is `data.shuffle`), with `next(count) -> indices`, `update(indices,
rewards, group_ids)` and `state_dict()` / `load_state_dict()`. One registered with
`examples=True` is also given the training Examples (`examples=`, e.g. to read a cluster
field); one registered with `extend=fn` adds training prompts of its own: `fn(examples, data,
**options)` returns them at set-up (after the task's), and it is given the examples too. One
whose `merge_repeats` is true (an attribute every sampler has: UniformSampler's is False) has a
prompt drawn k times in a step sampled as one group of k x rollout.n rollouts.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch

from upslope.bounds import Count, Fraction, NonNegative, Positive, PositiveCount
from upslope.data.types import Example
from upslope.errors import ConfigError
from upslope.registry import SAMPLERS

if TYPE_CHECKING:
    from upslope.config import DataConfig


@SAMPLERS.register("uniform")
class UniformSampler:
    """Epochs over the prompts, reshuffled each epoch with a seeded generator."""

    merge_repeats: bool = False  # is a prompt drawn k times in one step sampled as one group of k x n?

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True):
        self.num_prompts, self.seed, self.shuffle = num_prompts, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        gen = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return torch.randperm(self.num_prompts, generator=gen).tolist()

    def next(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.position >= self.num_prompts:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            take = min(count - len(out), self.num_prompts - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    def update(self, indices: list[int], rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
        """Per-prompt statistics feedback (unused by the uniform sampler; curricula use it)."""

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()



class OutcomeSampler(UniformSampler):
    """Base of the feedback samplers: per-prompt success/trial counts from `update` (a sample
    succeeds when its reward >= `threshold`), a seeded pick from a candidate pool, and the
    uniform order for whatever the pool does not fill. Subclasses define `pool_share()` and
    `pool()`; state (counts, draws, uniform position) round-trips through checkpoints."""

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, *, threshold: float = 0.5):
        super().__init__(num_prompts, seed, shuffle)
        self.threshold = threshold
        self.successes = torch.zeros(num_prompts)
        self.trials = torch.zeros(num_prompts)
        self.draws = 0  # calls to next(): the pacing clock and the pool pick's seed

    def update(self, indices: list[int], rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
        """Add each group's successes and samples to its prompt's counts (group id g is prompt indices[g])."""
        prompts = torch.tensor(indices, dtype=torch.long)[group_ids.long()]
        self.successes.index_add_(0, prompts, (rewards >= self.threshold).float())
        self.trials.index_add_(0, prompts, torch.ones_like(rewards, dtype=torch.float32))

    def pass_rate(self) -> torch.Tensor:
        """Observed success rate per prompt (NaN where never sampled)."""
        return self.successes / self.trials.where(self.trials > 0, torch.tensor(float("nan")))

    def pool_share(self) -> float:
        return 0.0

    def pool(self) -> torch.Tensor:
        return torch.zeros(self.num_prompts, dtype=torch.bool)

    def pick(self, candidates: torch.Tensor, take: int, gen: torch.Generator) -> list[int]:
        """`take` distinct pool prompts: a seeded random pick."""
        return candidates[torch.randperm(len(candidates), generator=gen)[:take]].tolist()

    def next(self, count: int) -> list[int]:
        """`pool_share()` of the batch from the pool (seeded random pick), the rest in uniform order."""
        self.draws += 1
        candidates = torch.nonzero(self.pool()).flatten()
        gen = torch.Generator().manual_seed(self.seed * 104729 + self.draws)
        take = min(int(round(self.pool_share() * count)), len(candidates))
        chosen = self.pick(candidates, take, gen)
        rest: list[int] = []
        for _ in range(3):  # the uniform order may repeat a pool prompt: skip it, draw again
            rest += [i for i in super().next(count - take - len(rest)) if i not in chosen]
            if len(rest) >= count - take:
                break
        rest += super().next(count - take - len(rest)) if len(rest) < count - take else []
        return chosen + rest[:count - take]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "successes": self.successes.clone(), "trials": self.trials.clone(),
                "draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.successes, self.trials, self.draws = state["successes"].clone(), state["trials"].clone(), state["draws"]


@SAMPLERS.register("boundary", examples=True)
class BoundarySampler(OutcomeSampler):
    """ADS-style boundary curriculum (Adaptive Data Scheduling): prefer prompts whose observed
    pass rate is neither 0 nor 1, with a paced share of each batch (0 -> max_share over pace_steps).
    With `cluster_key`, the prompts are clustered by that example field, and each boundary draw
    first picks a cluster (weight: the share of its sampled prompts on the boundary, Laplace
    smoothed, to the power cluster_power), then a boundary prompt in it. ADS clusters by semantic
    embedding; a task field standing in for it and this weight are our choices.

    threshold: a sample succeeds when its reward is at least this
    max_share: largest fraction of a batch drawn from the boundary prompts
    pace_steps: steps over which the boundary share rises linearly from 0 to max_share
    cluster_key: example field naming a prompt's cluster (e.g. carries for arith); empty: no cluster level
    cluster_power: exponent on a cluster's boundary share in its weight (0: clusters equally likely)
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True,
                 examples: Sequence[Example] | None = None, *, threshold: float = 0.5, max_share: Fraction = 0.5,
                 pace_steps: Count = 10, cluster_key: str = "", cluster_power: NonNegative = 1.0):
        super().__init__(num_prompts, seed, shuffle, threshold=threshold)
        self.max_share, self.pace_steps, self.cluster_power = max_share, max(pace_steps, 1), cluster_power
        self.clusters = cluster_labels(examples, cluster_key, num_prompts) if cluster_key else None

    def pool_share(self) -> float:
        return self.max_share * min(1.0, (self.draws - 1) / self.pace_steps)

    def pool(self) -> torch.Tensor:
        return (self.successes > 0) & (self.successes < self.trials)

    def cluster_weights(self) -> torch.Tensor:
        """Per cluster: ((boundary prompts + 1) / (sampled prompts + 2)) ** cluster_power."""
        assert self.clusters is not None
        k = int(self.clusters.max()) + 1
        boundary = torch.zeros(k).index_add_(0, self.clusters, self.pool().float())
        sampled = torch.zeros(k).index_add_(0, self.clusters, (self.trials > 0).float())
        return ((boundary + 1) / (sampled + 2)) ** self.cluster_power

    def pick(self, candidates: torch.Tensor, take: int, gen: torch.Generator) -> list[int]:
        """Without clusters a random pick; with them, cluster by weight, then a random boundary prompt in it."""
        if self.clusters is None:
            return super().pick(candidates, take, gen)
        left = candidates[torch.randperm(len(candidates), generator=gen)].tolist()
        weights, out = self.cluster_weights(), []
        for _ in range(take):
            live = torch.zeros_like(weights)
            live[self.clusters[left]] = 1.0
            c = int(torch.multinomial(weights * live, 1, generator=gen))
            out.append(next(i for i in left if int(self.clusters[i]) == c))
            left.remove(out[-1])
        return out


def cluster_labels(examples: Sequence[Example] | None, key: str, num_prompts: int) -> torch.Tensor:
    """Cluster index [num_prompts] of each prompt from its example's field `key` (values in sorted order)."""
    if examples is None or len(examples) != num_prompts:
        raise ConfigError("data.sampler.options.cluster_key: this sampler was not given the training examples")
    missing = next((ex.id or str(i) for i, ex in enumerate(examples) if key not in ex.meta), None)
    if missing is not None:
        raise ConfigError(f"data.sampler.options.cluster_key={key}: example {missing} has no field '{key}'")
    names = sorted({str(ex.meta[key]) for ex in examples})
    index = {n: i for i, n in enumerate(names)}
    return torch.tensor([index[str(ex.meta[key])] for ex in examples], dtype=torch.long)


GUIDED = "boundary_guided_of"  # meta key of a guided copy: the index of the training prompt it guides


def hinted(ex: Example, text: str) -> Example:
    """A copy of `ex` whose last user turn ends with `text`."""
    if isinstance(ex.prompt, str):
        return replace(ex, prompt=ex.prompt + text)
    msgs = [dict(m) for m in ex.prompt]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    if last is None:
        raise ConfigError(f"data.sampler boundary_aware guidance: example {ex.id or '?'} has no user turn to hint in")
    msgs[last]["content"] = str(msgs[last]["content"]) + text
    return replace(ex, prompt=msgs)


def guided_copies(examples: Sequence[Example], data: DataConfig, *, guidance: str = "none", hint_share: float = 0.5,
                  hint: str = " (Hint: the answer begins with {prefix}.)", **_: Any) -> list[Example]:
    """With guidance `answer_prefix`, a copy of every training prompt hinted with the first hint_share of its
    reference answer's characters (at least one); none otherwise."""
    if guidance == "none":
        return []
    if "{prefix}" not in hint:
        raise ConfigError(f"data.sampler.options.hint: must contain {{prefix}} (got {hint!r})")
    out = []
    for i, ex in enumerate(examples):
        if ex.answer is None:
            raise ConfigError(f"data.sampler boundary_aware guidance: example {ex.id or i} has no reference answer")
        ref = str(ex.answer)
        prefix = ref[:max(1, math.ceil(hint_share * len(ref)))]
        meta = {**ex.meta, GUIDED: i, "metrics": {**ex.meta.get("metrics", {}), "boundary/guided": 1.0}}
        out.append(replace(hinted(ex, hint.format(prefix=prefix)), meta=meta, id=f"{ex.id}-guided" if ex.id else ""))
    return out


@SAMPLERS.register("boundary_aware", extend=guided_copies)
class BoundaryAwareSampler(OutcomeSampler):
    """Boundary-aware curriculum: first locate the capability boundary (uniform draws for
    locate_steps, each group's pass@n recorded), then consolidate: draw `share` of each batch
    from prompts solved at least once (pass@n > 0) but below `consolidate_below` pass rate.
    With guidance, teacher guidance for prompts beyond the boundary: once located, a drawn prompt
    that was sampled and never solved is served as its guided copy (a training prompt the sampler
    adds: the prompt with a hint of the first hint_share of its reference answer); the guided
    copies' outcomes do not count toward the boundary (it is the unguided policy's).

    threshold: a sample succeeds when its reward is at least this
    locate_steps: steps of uniform draws that locate the boundary before consolidating
    consolidate_below: prompts with a pass rate below this (and above 0) are consolidated
    share: fraction of each consolidation batch drawn from those prompts
    guidance: none, or answer_prefix (prompts beyond the boundary get a hint from their reference answer)
    hint_share: share of the reference answer's characters the hint gives (at least one character)
    hint: text appended to the prompt's last user turn; {prefix} is the answer's first characters
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, examples: Sequence[Example] = (), *,
                 threshold: float = 0.5, locate_steps: Count = 5, consolidate_below: Fraction = 0.75,
                 share: Fraction = 0.75, guidance: Literal["none", "answer_prefix"] = "none",
                 hint_share: Fraction = 0.5, hint: str = " (Hint: the answer begins with {prefix}.)"):
        # guidance, hint_share and hint shape the guided copies, added at set-up (`guided_copies`); here: where they are
        self.guided_of = {int(ex.meta[GUIDED]): i for i, ex in enumerate(examples) if GUIDED in ex.meta}
        super().__init__(num_prompts - len(self.guided_of), seed, shuffle, threshold=threshold)
        self.locate_steps, self.below, self.share = locate_steps, consolidate_below, share

    def pool_share(self) -> float:
        return self.share if self.draws > self.locate_steps else 0.0

    def pool(self) -> torch.Tensor:
        rate = self.pass_rate().nan_to_num(0.0)
        return (self.successes > 0) & (rate < self.below)

    def next(self, count: int) -> list[int]:
        """The consolidation draw, each prompt beyond the located boundary replaced by its guided copy."""
        out = super().next(count)
        if not self.guided_of or self.draws <= self.locate_steps:
            return out
        beyond = (self.trials > 0) & (self.successes == 0)
        return [self.guided_of[i] if bool(beyond[i]) and i in self.guided_of else i for i in out]

    def update(self, indices: list[int], rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
        """The counts of the unguided prompts' groups (a guided copy's outcome is not the policy's own)."""
        own = [g for g, i in enumerate(indices) if i < self.num_prompts]
        if len(own) < len(indices):
            rows = torch.isin(group_ids, torch.tensor(own, dtype=group_ids.dtype))
            remap = {g: k for k, g in enumerate(own)}
            indices = [indices[g] for g in own]
            rewards = rewards[rows]
            group_ids = torch.tensor([remap[int(g)] for g in group_ids[rows]], dtype=torch.long)
        super().update(indices, rewards, group_ids)


@SAMPLERS.register("codapo", confidence=True)
class CodapoSampler(OutcomeSampler):
    """CoDaPO's resampling: `share` of each batch re-draws seen questions, without replacement, with probability
    proportional to their value 4p(1 - p)(1 - c) (the advantage `codapo`'s: p the pass rate and c the mean
    rollout confidence of the question's rollouts at the step it was last sampled); the rest of the batch in
    uniform order. A question of value 0 (all its rollouts right, or all wrong, or fully confident) is not
    re-drawn. The abstract resamples within mini-batches; here a question's value is known once its rollouts
    are scored, so the re-draws fill the following steps' fixed prompt budget.

    threshold: a sample succeeds when its reward is at least this
    share: fraction of each batch re-drawn from the seen questions by value (0: uniform)
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, *, threshold: float = 0.5,
                 share: Fraction = 0.25):
        super().__init__(num_prompts, seed, shuffle, threshold=threshold)
        self.share = share
        self.value = torch.zeros(num_prompts, dtype=torch.float64)

    def update(self, indices: list[int], rewards: torch.Tensor, group_ids: torch.Tensor,
               confidence: torch.Tensor | None = None) -> None:
        """The counts, and each prompt sampled in this update gets the value of its samples here."""
        from upslope.algos.confidence import learnable_value

        super().update(indices, rewards, group_ids)
        if confidence is None:
            raise ConfigError("data.sampler codapo: its update needs each sample's confidence")
        prompts = torch.tensor(indices, dtype=torch.long)[group_ids.long()]
        n = torch.zeros(self.num_prompts, dtype=torch.float64).index_add_(0, prompts, torch.ones(len(prompts),
                                                                                                dtype=torch.float64))
        right = torch.zeros_like(n).index_add_(0, prompts, (rewards >= self.threshold).to(torch.float64))
        conf = torch.zeros_like(n).index_add_(0, prompts, confidence.to(torch.float64))
        seen = n > 0
        self.value[seen] = learnable_value(right[seen] / n[seen], conf[seen] / n[seen])

    def pool_share(self) -> float:
        return self.share

    def pool(self) -> torch.Tensor:
        return self.value > 0

    def pick(self, candidates: torch.Tensor, take: int, gen: torch.Generator) -> list[int]:
        """`take` distinct pool prompts drawn with probability proportional to their value."""
        if take == 0:
            return []
        return candidates[torch.multinomial(self.value[candidates], take, generator=gen)].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "value": self.value.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.value = state["value"].clone()


@SAMPLERS.register("cero")
class CeroSampler(OutcomeSampler):
    """CERO: a Beta posterior over each prompt's success probability; each step's budget of
    groups (prompts_per_step groups of rollout.n rollouts) goes, one group at a time, to the prompt
    with the highest value of more rollouts: E[p(1-p)] under the posterior, made concave by dividing
    by 1 + groups_so_far / saturation (diminishing returns), ties broken by a seeded shuffle. The
    collect stage samples a fixed rollout.n per prompt, so a prompt gets more rollouts as more
    draws (up to max_groups a step); with merge_groups (default) a prompt's draws are one group of
    draws x rollout.n rollouts (the paper's variable rollouts per prompt; the step's budget stays
    prompts_per_step x rollout.n), else separate groups each normalised on its own. The paper's
    Fenchel-dual budget variables are replaced by this greedy saturating allocation.

    threshold: a sample succeeds when its reward is at least this
    prior_alpha: Beta prior successes
    prior_beta: Beta prior failures
    saturation: groups given to one prompt at which its value has halved
    max_groups: most draws of rollout.n one prompt gets in a step (1: each step's prompts are distinct)
    merge_groups: a prompt's draws in a step form one group of draws x rollout.n rollouts (false: one group each)
    """

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True, *, threshold: float = 0.5,
                 prior_alpha: Positive = 1.0, prior_beta: Positive = 1.0, saturation: Positive = 4.0,
                 max_groups: PositiveCount = 1,
                 merge_groups: bool = True):
        super().__init__(num_prompts, seed, shuffle, threshold=threshold)
        self.merge_repeats = merge_groups
        self.prior = (prior_alpha, prior_beta)
        self.saturation, self.max_groups = saturation, max(max_groups, 1)
        self.prompt_draws = torch.zeros(num_prompts)

    def value(self) -> torch.Tensor:
        """Posterior expected Bernoulli variance a*b / ((a+b)(a+b+1)), divided by 1 + groups/saturation."""
        a, b = self.prior[0] + self.successes, self.prior[1] + self.trials - self.successes
        return a * b / ((a + b) * (a + b + 1)) / (1 + self.prompt_draws / self.saturation)

    def next(self, count: int) -> list[int]:
        self.draws += 1
        gen = torch.Generator().manual_seed(self.seed * 104729 + self.draws)
        order = torch.randperm(self.num_prompts, generator=gen)  # seeded tie-break: first in order wins
        taken = torch.zeros(self.num_prompts)
        out = []
        for _ in range(min(count, self.num_prompts * self.max_groups)):
            v = self.value()[order].masked_fill(taken[order] >= self.max_groups, -1.0)
            pick = int(order[int(torch.argmax(v))])  # argmax returns the first maximum
            out.append(pick)
            taken[pick] += 1
            self.prompt_draws[pick] += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "prompt_draws": self.prompt_draws.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prompt_draws = state["prompt_draws"].clone()


def make_sampler(data: DataConfig, num_prompts: int, seed: int, examples: Sequence[Example] = ()) -> Any:
    """The sampler `data.sampler` names, over `num_prompts` prompts, seeded (options checked); one
    registered with `examples=True` or an `extend` hook also gets the training `examples`."""
    build = SAMPLERS.bind(data.sampler.name, data.sampler.options, where="data.sampler.options")
    traits = SAMPLERS.get(data.sampler.name).traits
    if traits.examples or traits.extend is not None:
        return build(num_prompts, seed, data.shuffle, examples=examples)
    return build(num_prompts, seed, data.shuffle)


def sampler_examples(data: DataConfig, examples: Sequence[Example]) -> list[Example]:
    """Training prompts the sampler adds to the task's (its `extend` hook: TD-Grokking's subproblems); none for most."""
    extend = SAMPLERS.get(data.sampler.name, "data.sampler.name").traits.extend
    return extend(examples, data, **data.sampler.options) if extend else []
