"""The collect stage on the real HF engine and a real reward: resampling rounds until enough
groups are kept, unique group ids across rounds, the cut to `want` groups, what is counted;
and the one timing helper."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from upslope.config import RewardSpec
from upslope.data.types import Example
from upslope.engine import SamplingParams
from upslope.errors import UpslopeError
from upslope.registry import REWARD_COMBINERS, ROLLOUTS
from upslope.rewards import build_reward_fns
from upslope.rollout.plugin import rollout_fn, single_turn
from upslope.train.collect import Collected, Rounds, Task, collect, on_engine
from upslope.train.timing import StageClock, throughput

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"
QUESTIONS = [f"What is {i} + {i}?" for i in range(8)]


@pytest.fixture(scope="module")
def task(encode_chat) -> Task:
    fns = build_reward_fns([RewardSpec(name=f"{TOY}:long_text")])
    return Task(encode_chat(QUESTIONS), [Example(prompt=q, answer=str(2 * i)) for i, q in enumerate(QUESTIONS)],
                fns, REWARD_COMBINERS.bind("weighted_sum"), pad_id=2)


class Draws:
    """Prompt indices in order, recording each request's size."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.next_index = 0

    def __call__(self, k: int) -> list[int]:
        self.asked.append(k)
        out = [(self.next_index + i) % len(QUESTIONS) for i in range(k)]
        self.next_index += k
        return out


PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=100, stop_token_ids=[2])  # round r: seed 100 + r


def run(engine, task: Task, draw, *, keep=None, rollout=None, clock=None, on_kept=None, **rounds) -> Collected:
    """collect on the engine's single-turn rollout (or `rollout`) with these Rounds."""
    return collect(task, rollout or on_engine(engine, single_turn, 2), draw, PARAMS, Rounds(**rounds), keep,
                   clock=clock, on_kept=on_kept)


def test_resampling_refills_until_want_groups_are_kept(hf_engine, task):
    """Keeping only even group ids: round 1 draws 4 prompts and keeps 2 groups, round 2 draws the
    2 missing and keeps 1 (ids 4, 5: only 4 is even), round 3 draws 1 more (id 6) and is full."""
    draws, clock = Draws(), StageClock()
    keep = lambda b: b.select(torch.nonzero(b.group_ids % 2 == 0).flatten())  # noqa: E731
    got = run(hf_engine, task, draws, want=4, per_round=4, max_rounds=5, keep=keep, clock=clock)
    assert draws.asked == [4, 2, 1]
    assert got.indices == [0, 1, 2, 3, 4, 5, 6] and got.drawn == 7
    assert sorted(got.batch.group_ids.unique().tolist()) == [0, 2, 4, 6]  # unique across rounds
    assert got.kept_groups == 4 and got.dropped == 3 and got.batch.size == 8
    assert got.seen.size == 14 and got.metrics["rollout/prompts_drawn"] == 7.0
    assert got.metrics["rollout/generated_tokens"] == float(got.seen.completion_lens.sum())
    assert got.batch.rewards is not None and len(got.batch.reward_components) == 1
    assert set(clock.seconds) == {"rollout", "reward"}


def test_full_rounds_without_refill_and_the_cut_to_want(hf_engine, task):
    """refill=False draws per_round every round (on-policy DPO); more kept groups than wanted are
    cut to the first `want`."""
    draws = Draws()
    got = run(hf_engine, task, draws, want=3, per_round=2, refill=False, max_rounds=3)
    assert draws.asked == [2, 2]
    assert got.kept_groups == 4 and got.batch.group_ids.unique().tolist() == [0, 1, 2]


def test_the_round_limit_stops_an_empty_keep(hf_engine, task):
    draws = Draws()
    got = run(hf_engine, task, draws, want=2, per_round=2, max_rounds=1, keep=lambda b: b.select([]))
    assert draws.asked == [2, 2] and got.batch.size == 0 and got.dropped == 4 and got.seen.size == 8


def test_no_rewards_means_no_reward_stage(hf_engine, task):
    bare = Task(task.prompt_ids, task.examples, pad_id=2)
    clock = StageClock()
    got = run(hf_engine, bare, Draws(), want=2, per_round=2, clock=clock)
    assert got.batch.rewards is None and "reward" not in clock.seconds and got.batch.size == 4


def per_group_reversed(engine):
    """A round's groups as pieces of one group each, arriving last first (as Ray jobs may)."""
    def pieces(prompts, examples, params, group_offset):
        b = single_turn(engine, prompts, examples, params, 2, group_offset)
        for g in reversed(b.group_ids.unique().tolist()):
            yield b.select(torch.nonzero(b.group_ids == g).flatten())
    return pieces


def test_a_round_in_pieces_collects_what_the_whole_round_does(hf_engine, task):
    """The Ray workers' path: each piece is rewarded and filtered on arrival and its kept groups go to
    on_kept at once; the result (batch, everything seen, counts, metrics) is the whole-round one."""
    keep = lambda b: b.select(torch.nonzero(b.group_ids % 2 == 0).flatten())  # noqa: E731
    whole = run(hf_engine, task, Draws(), want=4, per_round=4, max_rounds=5, keep=keep)
    handed: list = []
    clock = StageClock()
    got = run(hf_engine, task, Draws(), want=4, per_round=4, max_rounds=5, keep=keep, clock=clock,
                  rollout=per_group_reversed(hf_engine), on_kept=handed.append)
    assert [b.group_ids.unique().tolist() for b in handed] == [[2], [0], [4], [6]]  # as they arrived
    for a, b in ((got.batch, whole.batch), (got.seen, whole.seen)):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.group_ids, b.group_ids)
        assert torch.equal(a.rewards, b.rewards) and [m["completion"] for m in a.meta] == [m["completion"] for m in b.meta]
    assert (got.indices, got.kept_groups, got.dropped) == (whole.indices, whole.kept_groups, whole.dropped)
    assert got.metrics == whole.metrics and set(clock.seconds) == {"rollout", "reward"}


def test_the_strict_reward_check_is_per_round_not_per_piece(hf_engine, encode_chat):
    """A reward failing on one group of a round is a counted failure even when that group arrives as
    its own piece; failing on every sample of the round is still an error."""
    examples = [Example(prompt=q, answer=str(2 * i)) for i, q in enumerate(QUESTIONS)]
    for name, ok in (("fails_on_zero", True), ("always_fails", False)):
        t = Task(encode_chat(QUESTIONS), examples, build_reward_fns([RewardSpec(name=f"{TOY}:{name}")]),
                 REWARD_COMBINERS.bind("weighted_sum"), pad_id=2)
        attempt = lambda: run(hf_engine, t, Draws(), want=4, per_round=4,  # noqa: E731
                                  rollout=per_group_reversed(hf_engine), on_kept=lambda b: None)
        if ok:
            assert attempt().metrics[f"reward_failures/{name}"] == 2.0  # group 0's two samples
        else:
            with pytest.raises(UpslopeError, match="failed on every sample"):
                attempt()


def test_pieces_handed_on_need_refill(hf_engine, task):
    with pytest.raises(ValueError, match="on_kept needs refill"):
        run(hf_engine, task, Draws(), want=2, per_round=2, refill=False, on_kept=lambda b: None)


def test_rollouts_come_from_the_registry():
    assert rollout_fn("single_turn") is single_turn
    assert ROLLOUTS.get("single_turn").fn is single_turn


def test_stage_clock_accumulates_per_stage():
    clock = StageClock()
    for _ in range(2):
        with clock("a"):
            time.sleep(0.01)
    with pytest.raises(RuntimeError):
        with clock("b"):
            raise RuntimeError("the time still counts")
    m = clock.metrics()
    assert set(m) == {"time/a", "time/b"} and m["time/a"] >= 0.02
    assert throughput({"rollout/generated_tokens": 10.0, "time/rollout": 2.0, "learner/tokens": 4.0}) == \
        {"rollout/tokens_per_s": 5.0}  # no learner time: no learner rate


def test_a_pausing_stage_is_left_out_of_the_one_it_runs_in():
    """The learner's streamed work inside the wait for rollouts: the wait's time and timeline spans
    exclude it, so the two never overlap; the enclosing step (not paused) keeps counting."""
    clock = StageClock()
    with clock("step"):
        t0 = time.perf_counter()
        with clock("rollout"):
            time.sleep(0.02)
            with clock("learner", pause="rollout"):
                time.sleep(0.05)
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        with clock("other", pause="rollout"):  # pausing a stage that is not running changes nothing
            pass
    s = clock.seconds
    assert s["learner"] >= 0.05 and s["rollout"] >= 0.04 and s["step"] >= elapsed
    assert s["rollout"] + s["learner"] == pytest.approx(elapsed, abs=5e-3)
    spans = {stage: [(a, b) for st, a, b in clock.spans if st == stage] for stage in ("rollout", "learner")}
    (l0, l1), = spans["learner"]
    assert len(spans["rollout"]) == 2 and all(b <= l0 or a >= l1 for a, b in spans["rollout"])
    assert not clock.open


def test_merged_repeats_are_one_group_of_variable_size(hf_engine, task):
    """CERO's variable rollouts per prompt: prompt 3 drawn twice in a round is one group of 2 x n
    rollouts, and GRPO normalises its four rewards together (hand-computed mean and n - 1 std),
    while prompt 5 keeps its group of n; the budget is still counted in draws of n."""
    from upslope.algos.advantages import grpo

    got = run(hf_engine, task, lambda k: [3, 5, 3], want=3, per_round=3, merge_repeats=True)
    b = got.batch
    assert b.size == 6 and b.group_ids.tolist() == [0, 0, 1, 1, 0, 0] and got.indices == [3, 5, 3]
    assert got.kept_groups == 3 and got.dropped == 0
    assert all(b.meta[i]["example_id"] == task.examples[3].id for i in (0, 1, 4, 5))
    r = b.rewards.tolist()
    adv = grpo(b)
    for members in ([0, 1, 4, 5], [2, 3]):
        peers = [r[i] for i in members]
        m = sum(peers) / len(peers)
        s = (sum((x - m) ** 2 for x in peers) / (len(peers) - 1)) ** 0.5
        for i in members:
            want_adv = 0.0 if max(peers) == min(peers) else (r[i] - m) / (s + 1e-6)
            assert float(adv[i, int(b.prompt_lens[i])]) == pytest.approx(want_adv, abs=1e-5)
    assert len(set(r[i] for i in (0, 1, 4, 5))) > 1  # the four differ: the case is not a trivial tie
    apart = run(hf_engine, task, lambda k: [3, 5, 3], want=3, per_round=3)
    assert apart.batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2]  # without merging: three groups of n


def test_merged_repeats_arriving_in_pieces_are_joined_before_scoring(hf_engine, task):
    """A prompt's repeated draws may come back in different Ray jobs: with merge_repeats the round's
    pieces are joined first, so the result is the one-rollout result (one group of 2 x n for prompt 3)."""
    whole = run(hf_engine, task, lambda k: [3, 5, 3], want=3, per_round=3, merge_repeats=True)
    got = run(hf_engine, task, lambda k: [3, 5, 3], want=3, per_round=3, merge_repeats=True,
                  rollout=per_group_reversed(hf_engine))
    assert got.batch.group_ids.tolist() == whole.batch.group_ids.tolist() == [0, 0, 1, 1, 0, 0]
    assert torch.equal(got.batch.rewards, whole.batch.rewards)
    assert [m["completion"] for m in got.batch.meta] == [m["completion"] for m in whole.batch.meta]
    assert (got.kept_groups, got.dropped) == (whole.kept_groups, whole.dropped) == (3, 0)
    with pytest.raises(ValueError, match="merged repeats"):
        run(hf_engine, task, lambda k: [3, 5, 3], want=3, per_round=3, merge_repeats=True,
                rollout=per_group_reversed(hf_engine), on_kept=lambda b: None)


def test_engine_seed_reaches_every_engines_sampling():
    """engine.seed is mixed into each step's sampling seed (and evaluation's) whatever the engine; 0 keeps
    the run's own seeds."""
    from upslope.config import load_config
    from upslope.seeding import step_seed
    from upslope.train.sources import step_sampling

    plain = step_sampling(load_config(None, ["engine.name=hf"]), [2], step=3)
    assert plain.seed == step_seed(0, 3)
    seeded = [step_sampling(load_config(None, ["engine.name=hf", f"engine.seed={s}"]), [2], step=3).seed for s in (5, 6)]
    assert len({plain.seed, *seeded}) == 3
