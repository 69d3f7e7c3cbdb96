"""Reward-side seed methods against hand computations: SAW's CV weights, GD2PO's conflict masks and
consensus weights, ReCal's per-dataset scale, the Brier confidence reward (answering wrong on
purpose does not pay), selective prediction, the SuCo length reward, and ARKD's KL weights."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.advantages import gd2po, recal, reward_cancellation
from upslope.algos.combiners import cv_weights, saw
from upslope.algos.distill import Arkd, DistillInputs
from upslope.batch import Batch, build_batch
from upslope.errors import ConfigError
from upslope.registry import REWARDS
from upslope.rewards.calibration import brier_confidence, selective, stated_confidence
from upslope.rewards.length import suco_length

FAST = settings(max_examples=60, deadline=None)


def batch_of(groups: list[list[float]], components: dict[str, list[float]] | None = None,
             meta: list[dict] | None = None) -> Batch:
    """One row per reward (one trained completion token each), grouped as given."""
    rewards = [r for g in groups for r in g]
    n = len(rewards)
    b = build_batch(prompt_ids=[[7]] * n, completion_ids=[[5]] * n, completion_logprobs=[[-0.5]] * n,
                    group_ids=[i for i, g in enumerate(groups) for _ in g], truncated=[False] * n, pad_id=0)
    b.rewards = torch.tensor(rewards)
    b.reward_components = {k: torch.tensor(v) for k, v in (components or {}).items()}
    b.meta = meta or []
    return b


def per_sample(adv: torch.Tensor) -> torch.Tensor:
    return adv[:, 1]  # the one completion token after the one prompt token


# ---------------------------------------------------------------- SAW

def test_saw_weights_components_by_their_batch_coefficient_of_variation():
    a = torch.tensor([1.0, 1.0, 1.0, 0.0])  # nearly learned: mean 0.75, std sqrt(3)/4, cv 1/sqrt(3)
    b = torch.tensor([0.0, 1.0, 0.0, 1.0])  # under-learned: mean 0.5, std 0.5, cv 1
    w = cv_weights({"a": a, "b": b}, None, eps=0.0)
    cv_a, cv_b = 1 / math.sqrt(3), 1.0
    assert w["a"] == pytest.approx(2 * cv_a / (cv_a + cv_b)) and w["b"] == pytest.approx(2 * cv_b / (cv_a + cv_b))
    got = saw({"a": a, "b": b}, torch.zeros(4, dtype=torch.long), eps=1e-12)
    assert torch.allclose(got, w["a"] * a + w["b"] * b, atol=1e-6)
    # static weights multiply in; a batch where nothing varies keeps the static weights
    assert cv_weights({"a": a, "b": b}, {"b": 0.5}, eps=0.0)["b"] == pytest.approx(0.5 * w["b"])
    flat = {"a": torch.ones(4), "b": torch.zeros(4)}
    assert cv_weights(flat, {"a": 2.0}) == {"a": 2.0, "b": 1.0}
    with pytest.raises(ConfigError, match="unknown components"):
        saw({"a": a}, torch.zeros(4, dtype=torch.long), weights={"c": 1.0})


@FAST
@given(st.lists(st.floats(0.1, 5), min_size=2, max_size=8), st.floats(0.1, 100))
def test_saw_weights_do_not_change_when_a_component_is_rescaled(values, scale):
    a = torch.tensor(values, dtype=torch.float64)  # mean >= 0.1, far from eps, which would break the invariance
    b = torch.arange(len(values), dtype=torch.float64) % 2
    w1, w2 = cv_weights({"a": a, "b": b}, None, eps=1e-12), cv_weights({"a": a * scale, "b": b}, None, eps=1e-12)
    assert w1 == pytest.approx(w2, rel=1e-4, abs=1e-6)  # the CV is scale invariant


# ---------------------------------------------------------------- GD2PO

def test_gd2po_masks_conflicted_rollouts_and_reweights_queries_by_consensus():
    # group 0: correct [1,1,0,0], format [1,0,1,0]: rollouts 1 and 2 are pushed up by one
    # component and down by the other (cancellation 1), 0 and 3 agree; group 1 agrees throughout
    comps = {"correct": [1, 1, 0, 0, 1, 0], "format": [1, 0, 1, 0, 1, 0]}
    b = batch_of([[0] * 4, [0] * 2], comps)
    cancel = reward_cancellation({k: v.double() for k, v in b.reward_components.items()}, b.group_ids, None)
    assert cancel.tolist() == pytest.approx([0, 1, 1, 0, 0, 0])
    adv = per_sample(gd2po(b, batch_normalize=False))
    s0 = 2 * (0.5 / math.sqrt(1 / 3))  # each component of group 0 normalises to +-0.866
    s1 = 2 * (0.5 / math.sqrt(0.5))  # group 1: +-0.707 each
    w0, w1 = 0.5 / 0.75, 1.0 / 0.75  # consensus 0.5 and 1, over the batch mean 0.75
    want = [s0 * w0, 0, 0, -s0 * w0, s1 * w1, -s1 * w1]
    assert adv.tolist() == pytest.approx(want, rel=1e-5)
    no_reweight = per_sample(gd2po(b, batch_normalize=False, reweight=False))
    assert no_reweight.tolist() == pytest.approx([s0, 0, 0, -s0, s1, -s1], rel=1e-5)
    keep_all = per_sample(gd2po(b, batch_normalize=False, reweight=False, threshold=1.0))
    assert keep_all.tolist() == pytest.approx([s0, 0, 0, -s0, s1, -s1], rel=1e-5)  # they cancel to 0 anyway



@FAST
@given(st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1, max_size=5), min_size=1,
                max_size=4))
def test_gd2po_without_masking_or_reweighting_is_gdpo(groups):
    from upslope.algos.advantages import gdpo

    rows = [r for g in groups for r in g]
    comps = {"a": [float(a) for a, _ in rows], "b": [float(b) for _, b in rows]}
    b = batch_of([[0.0] * len(g) for g in groups], comps)
    assert torch.equal(gd2po(b, threshold=1.0, reweight=False), gdpo(b))
    masked = per_sample(gd2po(b, threshold=0.0, reweight=False))  # only rollouts whose components agree remain
    cancel = reward_cancellation({k: v.double() for k, v in b.reward_components.items()}, b.group_ids, None)
    assert torch.all(masked[cancel > 0] == 0)

def test_cancellation_of_a_partial_disagreement():
    comps = {"x": torch.tensor([1.0, 0.0], dtype=torch.float64), "y": torch.tensor([0.0, 1.0], dtype=torch.float64)}
    # group normalised: x -> [+s, -s], y -> [-s, +s]; weights 1 and 0.5: 1 - |s - s/2| / (s + s/2) = 2/3
    got = reward_cancellation(comps, torch.tensor([0, 0]), {"y": 0.5})
    assert got.tolist() == pytest.approx([2 / 3, 2 / 3])


# ---------------------------------------------------------------- ReCal

def test_recal_scales_each_dataset_to_unit_std():
    meta = [{"dataset": "a"}] * 4 + [{"dataset": "b"}] * 2
    b = batch_of([[0, 1], [1, 1], [0, 10]], meta=meta)  # one component: the reward itself
    adv = per_sample(recal(b))
    # group-normalised: a -> [-.707, .707, 0, 0] (pop std 0.5), b -> [-.707, .707] (pop std .707)
    h = 0.5 / math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([-h / 0.5, h / 0.5, 0, 0, -1, 1], rel=1e-4)
    one = per_sample(recal(batch_of([[0, 1], [1, 1], [0, 10]]), variance_power=0.0))  # no dataset field: one
    assert one.tolist() == pytest.approx([-1.2247, 1.2247, 0, 0, -1.2247, 1.2247], rel=1e-3)


def test_recal_variance_weights_by_hand():
    """Groups [0, 1] (population std 0.5) and [0, 10] (std 5) both normalise to +-0.7071; the mean query
    std is 2.75, so power 1 weighs them 0.5 / 2.75 and 5 / 2.75, then the dataset is scaled to unit std."""
    b = batch_of([[0, 1], [1, 1], [0, 10]])
    h = 1 / math.sqrt(2)
    a1, a2 = h * 0.5 / 2.75, h * 5 / 2.75
    sd = math.sqrt((2 * a1 ** 2 + 2 * a2 ** 2) / 6)
    got = per_sample(recal(b, variance_power=1.0))
    assert got.tolist() == pytest.approx([-a1 / sd, a1 / sd, 0, 0, -a2 / sd, a2 / sd], rel=1e-5)
    half = per_sample(recal(b))  # the default 0.5: weights sqrt(0.5 / 2.75) and sqrt(5 / 2.75)
    ratio = float(half[5] / half[1])
    assert ratio == pytest.approx(math.sqrt(10), rel=1e-5)


@FAST
@given(st.lists(st.lists(st.integers(0, 3), min_size=4, max_size=4), min_size=1, max_size=5))
def test_recal_power_one_undoes_the_group_std_division(groups):
    """With one component and equal group sizes, power 1 gives the centred rewards (r - group mean)
    scaled to unit population std over the batch: the std division is undone exactly."""
    b = batch_of([[float(x) for x in g] for g in groups])
    got = per_sample(recal(b, variance_power=1.0, eps=0.0)).double()
    r = torch.tensor(groups, dtype=torch.float64)
    centred = (r - r.mean(dim=1, keepdim=True)).flatten()
    sd = centred.pow(2).mean().sqrt()
    want = centred / sd if sd > 0 else torch.zeros_like(centred)
    assert torch.allclose(got, want.float().double(), atol=1e-5)


# ---------------------------------------------------------------- calibration

def reply(right: bool, confidence: float | None) -> str:
    text = "42" if right else "41"
    return text if confidence is None else f"{text}. Confidence: {round(confidence * 100)}%"


def brier(text: str, **opts) -> float:
    return brier_confidence(text, 42, {}, **opts)


def test_brier_reward_table_by_hand():
    assert brier(reply(True, 0.8)) == pytest.approx(1 - 0.04)
    assert brier(reply(False, 0.8)) == pytest.approx(-0.64)
    assert brier(reply(False, 0.0)) == 0.0 and brier(reply(True, 0.0)) == 0.0
    assert brier(reply(True, None)) == 0.0 and brier(reply(False, None)) == -1.0  # missing: worst confidence
    assert brier(reply(False, None), missing="zero") == 0.0
    assert brier("Confidence: 0.9 and the answer is 42") == pytest.approx(0.99)  # read without the statement
    assert stated_confidence("confidence = 70", REWARDS.get("brier_confidence").options()["pattern"].default)[0] == 0.7


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_answering_wrong_on_purpose_earns_less_than_an_honest_answer(p):
    """A model right with probability p: stating p honestly vs giving a wrong answer with confidence 0."""
    def honest(bonus):
        return p * brier(reply(True, p), correct_bonus=bonus) + (1 - p) * brier(reply(False, p), correct_bonus=bonus)

    hack = brier(reply(False, 0.0))
    assert honest(1.0) == pytest.approx(p * p, abs=1e-9) and honest(1.0) > hack
    assert honest(0.0) < brier(reply(False, 0.0), correct_bonus=0.0)  # the plain Brier reward is hackable


@FAST
@given(st.floats(0, 1), st.floats(0, 1), st.floats(1, 3))
def test_with_a_bonus_of_one_any_right_reply_beats_any_wrong_one(c_right, c_wrong, bonus):
    assert brier(reply(True, c_right), correct_bonus=bonus) >= brier(reply(False, c_wrong), correct_bonus=bonus)


def test_selective_prediction_reward_and_its_answer_threshold():
    assert selective("42", 42, {}) == 1.0 and selective("41", 42, {}) == -1.0
    assert selective("I don't know.", 42, {}) == 0.0
    # with a risk penalty of 3, answering pays only when P(right) > 3 / 4
    for p, answers in ((0.7, False), (0.8, True)):
        expected = p * selective("42", 42, {}, risk_penalty=3) + (1 - p) * selective("41", 42, {}, risk_penalty=3)
        assert (expected > selective("abstain", 42, {}, risk_penalty=3)) is answers
    with pytest.raises(ConfigError, match="abstain_reward"):
        selective("42", 42, {}, abstain_reward=2.0)


# ---------------------------------------------------------------- SuCo

def test_suco_length_reward_by_hand():
    texts = ["6", "6", "5", "5", "5", "5"]
    lengths = [10, 20, 5, 30, 4, 50]
    metas = [{"example_id": "a" if i < 4 else "b", "completion_tokens": n} for i, n in enumerate(lengths)]
    got = suco_length(texts, [6] * 6, metas)
    # group a: accuracy 1/2, shortest right 10 -> sufficient length 10 * (1 + 0.5) = 15
    assert got == pytest.approx([0.0, -(20 - 15) / 20, -(15 - 5) / 15, 0.0, 0.0, 0.0])  # group b: none right
    assert suco_length(texts, [6] * 6, metas, slack=0.0)[1] == pytest.approx(-0.5)
    assert REWARDS.get("suco_length").traits.batched


# ---------------------------------------------------------------- ARKD

def test_arkd_weights_forward_and_reverse_kl_by_hand():
    student = torch.log(torch.tensor([[[0.8, 0.2]]], dtype=torch.float64))
    teacher = torch.log(torch.tensor([[[0.5, 0.5]]], dtype=torch.float64))
    x = DistillInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), student, teacher)
    fkl = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    rkl = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    loss, m = Arkd()(x)  # a flat teacher: entropy log 2 / log 2 = 1, kept at 1 - floor
    assert loss.item() == pytest.approx(0.9 * fkl + 0.1 * rkl) and m["distill/arkd_fkl_weight"] == pytest.approx(0.9)
    loss, _ = Arkd(signal="gap", floor=0.0)(x)
    w = fkl / (fkl + rkl)
    assert loss.item() == pytest.approx(w * fkl + (1 - w) * rkl)
    with pytest.raises(ConfigError, match="floor"):
        Arkd(floor=0.7)
    assert Arkd().after_update({"distill/fkl_topk": 1.0, "distill/rkl_topk": 1.0}) == {}  # the rule learns nothing
    assert Arkd().state_dict() == {}  # and checkpoints nothing


def test_arkd_learned_weighting_by_hand():
    """w = sigmoid((a, b) + eps . (1, u)); the reward of step 1's eps is the drop of FKL + RKL from step 1 (2.0)
    to step 2 (1.2) = 0.8, and (a, b) += lr x (0.8 - baseline 0) x eps / sigma^2; the baseline becomes 0.1 x 0.8."""
    student = torch.log(torch.tensor([[[0.8, 0.2]]], dtype=torch.float64))
    teacher = torch.log(torch.tensor([[[0.5, 0.5]]], dtype=torch.float64))
    x = DistillInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), student, teacher)
    fkl = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    rkl = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    arkd = Arkd(weighting="learned", floor=0.0, init_a=-1.0, init_b=0.5, lr=0.1, sigma=0.5, seed=3)
    e1 = arkd.noise.tolist()
    gen = torch.Generator().manual_seed(3 * 1_000_003)  # step 0's noise: seeded by seed and steps done
    assert e1 == pytest.approx((torch.randn(2, generator=gen, dtype=torch.float64) * 0.5).tolist())
    w = 1 / (1 + math.exp(-((-1.0 + e1[0]) + (0.5 + e1[1]) * 1.0)))  # the flat teacher's signal u = 1
    loss, m = arkd(x)
    assert m["distill/arkd_fkl_weight"].item() == pytest.approx(w) and loss.item() == pytest.approx(w * fkl + (1 - w) * rkl)
    out = arkd.after_update({"distill/fkl_topk": 1.5, "distill/rkl_topk": 0.5})  # no reward yet
    assert out == {"distill/arkd_a": -1.0, "distill/arkd_b": 0.5} and arkd.noise.tolist() != e1
    state = arkd.state_dict()
    out = arkd.after_update({"distill/fkl_topk": 0.7, "distill/rkl_topk": 0.5})
    a, b = -1.0 + 0.1 * 0.8 * e1[0] / 0.25, 0.5 + 0.1 * 0.8 * e1[1] / 0.25
    assert out["distill/arkd_reward"] == pytest.approx(0.8)
    assert [out["distill/arkd_a"], out["distill/arkd_b"]] == pytest.approx([a, b]) and arkd.baseline == pytest.approx(0.08)
    again = Arkd(weighting="learned", floor=0.0, init_a=-1.0, init_b=0.5, lr=0.1, sigma=0.5, seed=3)
    again.load_state_dict(state)  # checkpointed: a restored copy makes the same update
    assert again.after_update({"distill/fkl_topk": 0.7, "distill/rkl_topk": 0.5}) == out


def test_a_bad_verifier_is_one_line_naming_the_option():
    with pytest.raises(ConfigError, match="reward 'brier_confidence' verifier_name: unknown reward 'nope'"):
        brier("42", verifier_name="nope")
    with pytest.raises(ConfigError, match="verifier_options.extrct: unknown option for reward 'integer'"):
        selective("42", 42, {}, verifier_options={"extrct": "first"})
    with pytest.raises(ConfigError, match="cannot be 'selective' itself"):
        selective("42", 42, {}, verifier_name="selective")
