"""Reward methods of Tier 2, part 3 against hand computations: C3RL's three terms and its reference
accuracy, DiScO's schema diversity within a group, MORE's constraint gate and min-norm (MGDA) weights,
and SEAR's segment rewards placed on the real tokenizer's tokens."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_helpers import score_and_check

from upslope.algos.combiners import min_norm_weights, more
from upslope.batch import build_batch
from upslope.config import RewardSpec
from upslope.errors import ConfigError
from upslope.registry import REWARD_COMBINERS, REWARDS
from upslope.rewards import build_reward_fns
from upslope.rewards.calibration import c3rl
from upslope.rewards.diversity import disco_diversity, schema
from upslope.rewards.placement import PlacedReward
from upslope.rewards.segments import segment_spans, segmented

FAST = settings(max_examples=60, deadline=None)


# ---------------------------------------------------------------- C3RL

def test_c3rl_terms_by_hand():
    """Answer 42. Replies: right at 80%, wrong at 60%, right with no statement (worst: c = 0), wrong at 0%.
    One dataset, accuracy 2 / 4 = 0.5, so a = 0.5 for all; reference_coef 0.5."""
    texts = ["42. Confidence: 80%", "41. Confidence: 60%", "42", "41. Confidence: 0%"]
    got = c3rl(texts, [42] * 4, [{}] * 4)
    want = [(1, -0.04, -0.5 * 0.09), (0, -0.36, -0.5 * 0.01), (1, -1.0, -0.5 * 0.25), (0, 0.0, -0.5 * 0.25)]
    for g, (y, cal, ref) in zip(got, want):
        assert g == pytest.approx({"correct": y, "calibration": cal, "reference": ref})


def test_c3rl_reference_is_the_accuracy_of_the_samples_dataset_or_the_examples_own():
    """Two datasets (carries 0: 1 right of 1; carries 1: 0 right of 2); the last sample carries its own
    reference accuracy 0.9, which replaces its dataset's."""
    texts = ["42 confidence 50%", "41 confidence 50%", "41 confidence 50%", "41 confidence 50%"]
    metas = [{"carries": 0}, {"carries": 1}, {"carries": 1}, {"carries": 1, "reference_accuracy": 0.9}]
    got = c3rl(texts, [42] * 4, metas, dataset_key="carries", reference_coef=1.0)
    # carries 1's round accuracy counts every sample of it, the one with its own reference too: 0 / 3
    assert [g["reference"] for g in got] == pytest.approx([-0.25, -0.25, -0.25, -0.16])
    assert [g["calibration"] for g in got] == pytest.approx([-0.25] * 4)


def test_c3rl_through_the_reward_stage_sums_its_components():
    [fn] = build_reward_fns([RewardSpec(name="c3rl", options={"correct_coef": 2.0})])
    assert fn.batched and REWARDS.get("c3rl").traits.whole_batch
    with pytest.raises(ConfigError, match="verifier cannot be 'c3rl'"):
        c3rl(["1"], [1], [{}], verifier_name="c3rl")


@FAST
@given(st.floats(0, 1), st.floats(0, 1))
def test_c3rl_answering_wrong_on_purpose_does_not_pay(p, a_given):
    """A model right with probability p that states p: its expected reward is at least the best wrong
    reply's (c = 0) under the same reference accuracy, with correct_coef 1 and reference_coef 0."""
    def reward(text):
        return sum(c3rl([text], [42], [{"reference_accuracy": a_given}], reference_coef=0.0)[0].values())

    pct = round(p * 100)
    honest = p * reward(f"42 confidence {pct}%") + (1 - p) * reward(f"41 confidence {pct}%")
    assert honest >= reward("41 confidence 0%") - 1e-9


# ---------------------------------------------------------------- DiScO

def test_disco_schema_and_group_diversity_by_hand():
    assert schema("2 + 3 = 6, wait, so = 5", *_disco_patterns()) == (("wait", "so"), ("6", "5"))
    texts = ["2 + 3 = 5", "2 + 3 = 5", "2 + 3 = 6, wait = 5", "2 + 3 = 4", "7 = 7"]
    metas = [{"example_id": "a"}] * 4 + [{"example_id": "b"}]
    opts = {"verifier_options": {"extract": "last"}}
    # group a: replies 0 and 1 share a schema (1 of 3 others alike), 2 is alone, 3 is wrong; b has one reply
    got = disco_diversity(texts, [5, 5, 5, 5, 7], metas, **opts)
    assert got == pytest.approx([2 / 3, 2 / 3, 1.0, 0.0, 0.0])
    every = disco_diversity(texts, [5, 5, 5, 5, 7], metas, only_correct=False, **opts)
    assert every == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0, 0.0])


def _disco_patterns() -> tuple[str, str]:
    opts = REWARDS.get("disco_diversity").options()
    return opts["transitions"].default, opts["candidates"].default


@FAST
@given(st.lists(st.sampled_from(["= 5", "wait = 5", "= 4 so = 5", "so = 5"]), min_size=2, max_size=6))
def test_disco_is_zero_for_a_group_of_one_schema_and_in_unit_range(texts):
    metas = [{"example_id": 0}] * len(texts)
    got = disco_diversity(texts, [5] * len(texts), metas, verifier_options={"extract": "last"})
    assert all(0.0 <= g <= 1.0 for g in got)
    if len(set(texts)) == 1:
        assert got == [0.0] * len(texts)


# ---------------------------------------------------------------- MORE

def test_min_norm_weights_by_hand():
    """g1 = (2, 0), g2 = (0, 1): w1 = (g2 - g1).g2 / |g1 - g2|^2 = 1 / 5, the point (0.4, 0.8), orthogonal to g2 - g1.
    g1 = (1, 0), g2 = (1, 1): the closest point of the segment to 0 is g1 itself."""
    w = min_norm_weights(torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    assert w.tolist() == pytest.approx([0.2, 0.8], abs=1e-6)
    w = min_norm_weights(torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64))
    assert w.tolist() == pytest.approx([1.0, 0.0], abs=1e-6)


@FAST
@given(st.lists(st.floats(-3, 3), min_size=6, max_size=6))
def test_min_norm_weights_match_the_two_gradient_closed_form(values):
    g = torch.tensor(values, dtype=torch.float64).view(2, 3)
    diff = g[0] - g[1]
    if float(diff @ diff) < 1e-6:
        return
    w1 = float(((g[1] - g[0]) @ g[1] / (diff @ diff)).clamp(0, 1))
    got = min_norm_weights(g)
    assert float(got.sum()) == pytest.approx(1.0) and float(got.min()) >= 0
    # the same minimum norm (the weights themselves may differ only where g1 = g2 along a tie)
    point = lambda w: w * g[0] + (1 - w) * g[1]  # noqa: E731
    assert float(point(float(got[0])).norm()) == pytest.approx(float(point(w1).norm()), abs=1e-5)


def test_more_gates_on_constraints_and_weights_objectives_by_hand():
    """One group: correct [1, 1, 1, 0] is the constraint; objectives a [1, 0, 1, 1] and b [0, 1, 1, 0].
    Over the three feasible replies a and b normalise to (1, -2, 1) / sqrt(3) and (-2, 1, 1) / sqrt(3):
    equal norms, so MGDA weighs them 0.5 each (a third objective c, flat there, gets 0)."""
    comps = {"correct": torch.tensor([1.0, 1, 1, 0]), "a": torch.tensor([1.0, 0, 1, 1]),
             "b": torch.tensor([0.0, 1, 1, 0]), "c": torch.tensor([1.0, 1, 1, 0])}
    gids = torch.zeros(4, dtype=torch.long)
    got = more(comps, gids, constraints={"correct": 0.5})
    assert got.tolist() == pytest.approx([0.5, 0.5, 1.0, -1.0], abs=1e-6)
    scaled = more(comps, gids, constraints={"correct": 0.5}, weights={"b": 2.0}, violation=-3.0)
    assert scaled.tolist() == pytest.approx([0.5, 1.0, 1.5, -3.0], abs=1e-6)
    with pytest.raises(ConfigError, match="constraints name unknown components"):
        more(comps, gids, constraints={"corect": 0.5})
    with pytest.raises(ConfigError, match="leave at least one objective"):
        more({"correct": comps["correct"]}, gids, constraints={"correct": 0.5})
    assert REWARD_COMBINERS.get("more").traits.whole_batch


def test_more_weights_balance_an_opposed_objective():
    """Two groups of two. a and b = 2a normalise to the same gradient g, c = 1 - a to -g. Frank-Wolfe from
    (1/3, 1/3, 1/3) steps toward c and stops where (2/3 - 2s/3) g - (1/3 + 2s/3) g = 0, s = 1/4:
    weights (1/4, 1/4, 1/2), the min-norm point 0: no direction improves every objective."""
    from upslope.algos.combiners import more_weights

    comps = {"a": torch.tensor([0.0, 1, 0, 1]), "b": torch.tensor([0.0, 2, 0, 2]), "c": torch.tensor([1.0, 0, 1, 0])}
    w = more_weights(comps, torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool))
    assert [w["a"], w["b"], w["c"]] == pytest.approx([0.25, 0.25, 0.5], abs=1e-6)


# ---------------------------------------------------------------- SEAR (segmented)

SEAR = {"segments": [{"reward": "format", "options": {"pattern": r"=\s*-?\d+"}, "end": "####", "weight": 0.5},
                     {"reward": "integer", "options": {"extract": "first"}}]}


def test_segment_spans_by_hand():
    assert segment_spans("a = 6 #### 5", ["####"]) == [(0, 10), (10, 12)]
    assert segment_spans("no boundary", ["####"]) == [(0, 11), (11, 11)]  # the answer segment is empty
    assert segment_spans("x|y|z", [r"\|", r"\|"]) == [(0, 2), (2, 4), (4, 5)]


def test_segmented_scores_each_segment_with_its_own_reward():
    got = segmented(["try = 6 #### 5", "#### 5", "= 5 and no answer"], [5, 5, 5], [{}] * 3, **SEAR)
    # reasoning tries a candidate (0.5) and the answer is right (1); no candidate; no answer segment (0)
    assert got == [PlacedReward(((12, 0.5), (14, 1.0))), PlacedReward(((4, 0.0), (6, 1.0))),
                   PlacedReward(((17, 0.5), (17, 0.0)))]
    assert segmented(["try = 6 #### 5"], [5], [{}], placement="sequence", **SEAR) == [1.5]


def test_segmented_rewards_land_on_the_segment_ends_tokens(tokenizer):
    """'= 6 #### 5' + end: the reasoning ends in the token that completes '####', the answer on the last text token."""
    text = "= 6 #### 5"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    hashes = next(k for k in range(len(ids)) if len(tokenizer.decode(ids[:k + 1])) >= 8)
    comps = [ids + [tokenizer.eos_token_id]]
    batch = build_batch([[1, 2]], comps, [[0.0] * len(comps[0])], [0], [False], tokenizer.pad_token_id,
                        meta=[{"answer": 5, "completion": text}])
    fns = build_reward_fns([RewardSpec(name="segmented", options=SEAR)])
    out, metrics = score_and_check(batch, fns, REWARD_COMBINERS.bind("weighted_sum"), 0.0, tokenizer=tokenizer)
    row = out.token_rewards[0].tolist()
    want = [0.0] * len(row)
    want[2 + hashes] += 0.5
    want[2 + len(ids) - 1] += 1.0
    assert row == pytest.approx(want), pieces
    assert out.rewards.tolist() == [1.5] and metrics["token_rewards/unplaced"] == 0.0


@pytest.mark.parametrize("segments, message", [
    ([{"reward": "format"}], "at least two entries"),
    ([{"reward": "format"}, {"reward": "integer"}], "needs an 'end' pattern"),
    ([{"reward": "format", "end": "("}, {"reward": "integer"}], "not a regular expression"),
    ([{"reward": "format", "end": "#", "wieght": 1}, {"reward": "integer"}], "got keys"),
    ([{"reward": "format", "end": "#", "weight": "x"}, {"reward": "integer"}], "must be a number"),
])
def test_segmented_bad_segments_are_one_line(segments, message):
    with pytest.raises(ConfigError, match=message):
        build_reward_fns([RewardSpec(name="segmented", options={"segments": segments})])


def test_segmented_fails_a_sample_when_a_segment_reward_fails():
    got = segmented(["= 1 #### 1"], ["not a number"], [{}], **SEAR)
    assert math.isnan(got[0])
