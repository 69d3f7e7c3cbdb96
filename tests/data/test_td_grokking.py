"""TD-Grokking: the arith decomposition by hand and as a property, the subproblems added
at set-up, and the sampler that queues them after an all-fail group (state through a checkpoint round trip)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.config import DataConfig, Plugin, load_config
from upslope.data import load_examples
from upslope.data.decompose import arith_steps, td_subproblems
from upslope.data.samplers import make_sampler, sampler_examples
from upslope.data.types import Example
from upslope.errors import ConfigError
from upslope.registry import REWARDS

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "td_grokking.yaml"
DATA = DataConfig(options={"ops": "+", "digits": 2, "prompt": "{a} {op} {b} ="},
                  sampler=Plugin(name="td_grokking", options={"share": 0.5}))


def root(a, op, b, i):
    return Example(prompt=f"{a} {op} {b} =", answer=a + b if op == "+" else a * b, meta={"a": a, "b": b, "op": op},
                   id=f"r{i}")


def test_arith_steps_by_hand():
    assert arith_steps(47, "+", 35) == [(7, "+", 5), (4, "+", 3), (70, "+", 12)]
    assert arith_steps(13, "*", 4) == [(4, "*", 3), (4, "*", 1), (40, "+", 12)]  # the longer operand is split
    assert arith_steps(7, "+", 5) == arith_steps(47, "+", 5) == arith_steps(3, "*", 4) == arith_steps(9, "-", 4) == []


@settings(max_examples=30, deadline=None)
@given(st.integers(10, 999), st.integers(10, 999), st.sampled_from("+*"))
def test_the_recombination_is_the_problem(a, b, op):
    """The last subproblem adds 10 x the second's answer to the first's, and that is the problem's answer."""
    value = {"+": lambda x, y: x + y, "*": lambda x, y: x * y}
    (a1, o1, b1), (a2, o2, b2), (a3, o3, b3) = arith_steps(a, op, b)
    assert (a3, o3, b3) == (10 * value[o2](a2, b2), "+", value[o1](a1, b1))
    assert a3 + b3 == value[op](a, b)


def test_subproblems_by_hand():
    """47 + 35 and 17 + 25 share 7 + 5: five distinct subproblems at level 1, in the task's prompt format, with
    their answers; depth 2 adds 70 + 12's and 30 + 12's (0 + 2 once). A subproblem that is already a training
    problem is not added again. The integer reward scores a subproblem's reply against its own answer."""
    roots = [root(47, "+", 35, 0), root(17, "+", 25, 1), root(7, "+", 5, 2)]
    subs = td_subproblems(roots, DATA)
    assert [(s.prompt, s.answer, s.meta["td_level"]) for s in subs] == [
        ("4 + 3 =", 7, 1), ("70 + 12 =", 82, 1), ("1 + 2 =", 3, 1), ("30 + 12 =", 42, 1)]
    deeper = td_subproblems(roots, DATA, depth=2)
    assert [s.prompt for s in deeper if s.meta["td_level"] == 2] == ["0 + 2 =", "7 + 1 =", "80 + 2 =", "3 + 1 =",
                                                                     "40 + 2 ="]
    reward = REWARDS.bind("integer", {"extract": "first_result"})
    assert reward(" 82", subs[1].answer, subs[1].meta) == 1.0 and reward(" 12", subs[1].answer, subs[1].meta) == 0.0
    with pytest.raises(ConfigError, match="no decomposition for task 'gsm8k'"):
        td_subproblems(roots, DataConfig(task="gsm8k"))
    with pytest.raises(ConfigError, match="depth: must be at least 1"):
        td_subproblems(roots, DATA, depth=0)


def _sampler(examples, **options):
    data = DATA.model_copy(update={"sampler": Plugin(name="td_grokking", options=options)})
    examples = examples + sampler_examples(data, examples)
    return make_sampler(data, len(examples), 0, examples), examples


def test_an_all_fail_group_queues_its_subproblems_for_the_next_draw():
    """Roots 0-3 (uniform epochs over them only). The first drawn root's group all wrong, the second's mixed:
    the first's three subproblems are queued, the next draw of 4 holds two of them (share 0.5) and two roots,
    then the third waits. A queued subproblem that fails again queues its own subproblems (depth 2; every
    root here carries, so every recombination decomposes)."""
    roots = [root(47, "+", 35, 0), root(18, "+", 26, 1), root(36, "+", 45, 2), root(51, "+", 29, 3)]
    sampler, examples = _sampler(roots, share=0.5, depth=2)
    first = sampler.next(4)
    assert sorted(first) == [0, 1, 2, 3]
    sampler.update(first[:2], torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    failed = examples[first[0]].meta
    expected = [f"{x} {o} {y} =" for x, o, y in arith_steps(failed["a"], "+", failed["b"])]
    assert [examples[i].prompt for i in sampler.queue] == expected
    nxt = sampler.next(4)
    assert [examples[i].prompt for i in nxt[:2]] == expected[:2] and all(i < 4 for i in nxt[2:])
    assert [examples[i].prompt for i in sampler.queue] == expected[2:]
    sampler.update([sampler.queue[0]], torch.zeros(2), torch.tensor([0, 0]))
    assert [examples[i].meta["td_level"] for i in sampler.queue] == [1, 2, 2, 2]


def test_the_queue_survives_a_checkpoint():
    roots = [root(47, "+", 35, 0), root(18, "+", 26, 1)]
    a, _ = _sampler(roots)
    a.update(a.next(2), torch.zeros(4), torch.tensor([0, 0, 1, 1]))
    b, _ = _sampler(roots)
    b.load_state_dict(a.state_dict())
    assert b.queue == a.queue and len(a.queue) == 6
    assert [b.next(2) for _ in range(4)] == [a.next(2) for _ in range(4)]


def test_the_recipe_adds_subproblems_of_the_headroom_task(tmp_path):
    """headroom's 10000 two-digit additions gain a few hundred distinct subproblems, in the same order every
    time (a resumed run's queue indexes the same prompts); the test split is untouched."""
    cfg = load_config(RECIPE, [f"run_dir={tmp_path}"])
    train = load_examples(cfg.data, "train")
    subs = sampler_examples(cfg.data, train)
    assert 100 < len(subs) < 1000 and [s.id for s in subs] == [s.id for s in sampler_examples(cfg.data, train)]
    assert subs[0].prompt.endswith(" =") and all(s.meta["td_level"] == 1 for s in subs)
    sampler = make_sampler(cfg.data, len(train) + len(subs), cfg.train.seed, train + subs)
    assert len(sampler.roots) == len(train) and max(sampler.next(len(train))) < len(train)
