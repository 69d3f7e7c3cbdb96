"""Token-credit and confidence advantages against hand computations: AH-GRPO and
SA-AH-GRPO's cumulative-surprisal discount, RREDCoT's segment redistribution, GraphAE's propagation,
ConSteer's shaped reward, ISPO's hinge and CoDaPO's bounded question weight; with property tests
of their invariants (tied groups stay 0, weights bounded, credit conserved)."""
from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.advantages import grpo
from upslope.algos.confidence import codapo, codapo_weights, consteer, ispo
from upslope.algos.credit import ah_grpo, graphae, rredcot
from upslope.batch import Batch, build_batch
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES

FAST = settings(max_examples=50, deadline=None)
A2 = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO's advantage in a group of rewards (1, 0)


def batch_of(rewards: list[float], logprobs: list[list[float]], groups: list[int] | None = None,
             tokens: list[list[int]] | None = None) -> Batch:
    """One row per reward after a one-token prompt; completion tokens carry the given sampler log-probs."""
    n = len(rewards)
    tokens = tokens or [[5] * len(lp) for lp in logprobs]
    b = build_batch(prompt_ids=[[7]] * n, completion_ids=tokens, completion_logprobs=logprobs,
                    group_ids=groups or [0] * n, truncated=[False] * n, pad_id=0)
    b.rewards = torch.tensor(rewards)
    return b


def completion(adv: torch.Tensor, row: int, length: int) -> list[float]:
    return adv[row, 1:1 + length].tolist()


def test_ah_grpo_discounts_each_token_by_the_surprisal_before_it():
    b = batch_of([1.0, 0.0], [[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    w = [1.0, math.exp(-0.5 * 1), math.exp(-0.5 * 3)]  # cumulative surprisal before: 0, 1, 3
    got = ah_grpo(b, alpha=0.5)
    assert completion(got, 0, 3) == pytest.approx([A2 * x for x in w], rel=1e-6)
    assert completion(got, 1, 3) == pytest.approx([-A2 * x for x in w], rel=1e-6)
    assert got[:, 0].tolist() == [0.0, 0.0]  # prompt token
    sel = ah_grpo(b, alpha=0.5, selective=True)  # SA-AH: the successful rollout keeps full weight
    assert completion(sel, 0, 3) == pytest.approx([A2] * 3, rel=1e-6)
    assert completion(sel, 1, 3) == pytest.approx([-A2 * x for x in w], rel=1e-6)
    assert torch.equal(ah_grpo(b, alpha=0.0), grpo(b))


def test_rredcot_gives_each_segment_its_share_of_the_surprisal():
    b = batch_of([1.0, 0.0], [[-1.0, -3.0], [-0.5, -0.5]])
    s = [1.001 / 4.002, 3.001 / 4.002]  # (surprisal + 1e-3) / total, one token per segment
    got = rredcot(b, segment_len=1)
    assert completion(got, 0, 2) == pytest.approx([A2 * 2 * s[0], A2 * 2 * s[1]], rel=1e-5)
    assert completion(got, 1, 2) == pytest.approx([-A2, -A2], rel=1e-5)  # equal surprisal: uniform
    two = rredcot(b, segment_len=2)  # one segment: GRPO's uniform credit
    assert completion(two, 0, 2) == pytest.approx([A2, A2], rel=1e-5)
    half = rredcot(b, segment_len=1, mix=0.5)
    assert completion(half, 0, 2) == pytest.approx([A2 * (0.5 + s[0]), A2 * (0.5 + s[1])], rel=1e-5)


def test_graphae_mixes_each_advantage_with_its_similar_neighbours():
    b = batch_of([1.0, 0.0, 0.0], [[-1.0, -1.0]] * 3, tokens=[[5, 6], [6, 5], [8, 9]])
    std = math.sqrt(1 / 3)
    a = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)]
    got = graphae(b, lam=0.5)[:, 1].tolist()
    # rows 0 and 1 use the same tokens (similarity 1), row 2 shares none: it keeps its own advantage
    assert got == pytest.approx([0.5 * a[0] + 0.5 * a[1], 0.5 * a[1] + 0.5 * a[0], a[2]], rel=1e-5)
    assert torch.equal(graphae(b, lam=0.0), grpo(b))


def test_ispo_adds_the_reasoning_informativeness_centred_in_the_group():
    """A tied group (both right, GRPO 0) with informativeness 0.3 and 0.1: +-0.1 x seq_coef 0.5 on every token;
    a mixed group keeps GRPO's advantage plus its own centred signal (0 when the gains tie), minus the hinge."""
    b = batch_of([1.0, 1.0, 1.0, 0.0], [[-1.0, -1.0]] * 3 + [[math.log(0.95), -1.0]], groups=[0, 0, 1, 1])
    got = ispo(b, torch.tensor([[0.3], [0.1], [0.2], [0.2]]), beta=0.5, tau=0.9, seq_coef=0.5)
    assert completion(got, 0, 2) == pytest.approx([0.05, 0.05]) and completion(got, 1, 2) == pytest.approx([-0.05] * 2)
    assert completion(got, 2, 2) == pytest.approx([A2, A2], rel=1e-5)
    assert completion(got, 3, 2) == pytest.approx([-A2 - 0.5 * 0.05, -A2], rel=1e-5)
    assert torch.equal(ispo(b, torch.tensor([[0.3], [0.1], [0.2], [0.2]]), seq_coef=0.0), ispo(b))
    assert ADVANTAGES.get("ispo").traits.features == "answer_gain"


def test_answer_gain_is_the_answers_log_prob_with_minus_without_the_reasoning(tiny_model_path):
    """Row 0: prompt 11 12, reasoning 21 22, answer (the last 2 tokens) 23 24: mean log p(23, 24) after the whole
    sequence minus after 11 12 alone. Row 1's reply is its answer alone (no reasoning): 0."""
    from upslope.models import load_model
    from upslope.train.learner.salience import answer_gain

    model = load_model(tiny_model_path).eval()
    b = build_batch([[11, 12], [11, 12, 13]], [[21, 22, 23, 24], [31, 32]], [[0.0] * 4, [0.0] * 2], [0, 1],
                    [False, False], pad_id=0)
    got = answer_gain(model, b, answer_tokens=2)

    def mean_lp(ids: list[int], at: list[int]) -> float:
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        return sum(float(lp[t - 1, ids[t]]) for t in at) / len(at)

    want = mean_lp([11, 12, 21, 22, 23, 24], [4, 5]) - mean_lp([11, 12, 23, 24], [2, 3])
    assert got.shape == (2, 1) and float(got[0, 0]) == pytest.approx(want, abs=1e-4) and float(got[1, 0]) == 0.0
    assert abs(want) > 1e-3  # the reasoning changes the answer's probability


def test_graphae_edges_from_reward_model_states():
    """States (1, 0), (1, 1), (-1, 0): cosine(0, 1) = 1/sqrt(2), cosine(0, 2) = -1 -> no edge, cosine(1, 2) =
    -1/sqrt(2) -> no edge; so rows 0 and 1 mix with each other at weight 1 and row 2 keeps its advantage,
    although its tokens equal row 0's (the Jaccard edge the states replace)."""
    b = batch_of([1.0, 0.0, 0.0], [[-1.0, -1.0]] * 3, tokens=[[5, 6], [8, 9], [5, 6]])
    for m, h in zip(b.meta, ([1.0, 0.0], [1.0, 1.0], [-1.0, 0.0])):
        m["reward_model_state"] = torch.tensor(h)
    std = math.sqrt(1 / 3)
    a = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)]
    got = graphae(b, lam=0.5)[:, 1].tolist()
    assert got == pytest.approx([0.5 * a[0] + 0.5 * a[1], 0.5 * a[1] + 0.5 * a[0], a[2]], rel=1e-5)
    assert graphae(b, lam=0.5, edges="reward_model").tolist() == graphae(b, lam=0.5).tolist()
    jac = graphae(b, lam=0.5, edges="jaccard")[:, 1].tolist()  # rows 0 and 2 share their tokens
    assert jac == pytest.approx([0.5 * a[0] + 0.5 * a[2], a[1], 0.5 * a[2] + 0.5 * a[0]], rel=1e-5)
    del b.meta[2]["reward_model_state"]  # auto falls back to Jaccard; reward_model asks for the states
    assert graphae(b, lam=0.5).tolist() == graphae(b, lam=0.5, edges="jaccard").tolist()
    with pytest.raises(ConfigError, match="keep_states: true"):
        graphae(b, edges="reward_model")


def test_consteer_shapes_the_reward_by_signed_confidence():
    c = [0.8, 0.6, 0.5]
    b = batch_of([1.0, 1.0, 0.0], [[math.log(x)] for x in c])
    shaped = [1 + 0.5 * 0.8, 1 + 0.5 * 0.6, 0 - 0.5 * 0.5]
    mean, sd = statistics.mean(shaped), statistics.stdev(shaped)
    assert consteer(b, beta=0.5)[:, 1].tolist() == pytest.approx([(x - mean) / (sd + 1e-6) for x in shaped], rel=1e-5)
    tied = batch_of([1.0, 1.0], [[math.log(0.9)], [math.log(0.3)]])  # all correct: the confident one wins
    assert consteer(tied)[:, 1].tolist() == pytest.approx([A2, -A2], rel=1e-5)


def test_consteer_outcome_normalisation_keeps_the_confidence_term_a_tie_breaker():
    """normalize=outcome: GRPO's advantage plus beta x the group-centred signed confidence. An all-wrong group,
    whose confidences 0.3 and 0.5 the shaped form turns into advantages of unit scale (+-A2: toward the less
    confident reply, the seed that collapsed), gets +-0.5 x 0.1 instead."""
    c = [0.8, 0.6, 0.5]
    b = batch_of([1.0, 1.0, 0.0], [[math.log(x)] for x in c])
    signed = [0.8, 0.6, -0.5]
    grpo_adv = [(r - 2 / 3) / (statistics.stdev([1, 1, 0]) + 1e-6) for r in (1, 1, 0)]
    want = [g + 0.5 * (s - statistics.mean(signed)) for g, s in zip(grpo_adv, signed)]
    assert consteer(b, beta=0.5, normalize="outcome")[:, 1].tolist() == pytest.approx(want, rel=1e-5)
    wrong = batch_of([0.0, 0.0], [[math.log(0.3)], [math.log(0.5)]])
    assert consteer(wrong, beta=0.5)[:, 1].tolist() == pytest.approx([A2, -A2], rel=1e-4)
    assert consteer(wrong, beta=0.5, normalize="outcome")[:, 1].tolist() == pytest.approx([0.05, -0.05], rel=1e-5)
    assert torch.equal(consteer(b, beta=0.0, normalize="outcome"), grpo(b))


def test_ispo_hinge_penalises_confident_tokens_of_wrong_rollouts_only():
    b = batch_of([1.0, 0.0], [[math.log(0.95), math.log(0.5)]] * 2)
    got = ispo(b, beta=0.5, tau=0.9)
    assert completion(got, 0, 2) == pytest.approx([A2, A2], rel=1e-5)
    assert completion(got, 1, 2) == pytest.approx([-A2 - 0.5 * 0.05, -A2], rel=1e-5)
    all_wrong = batch_of([0.0, 0.0], [[math.log(0.95)], [math.log(0.2)]])  # no GRPO signal, still a hinge
    assert all_wrong.rewards is not None and ispo(all_wrong)[:, 1].tolist() == pytest.approx([-0.025, 0.0], abs=1e-6)


def test_codapo_weight_from_pass_rate_and_confidence():
    b = batch_of([1.0, 0.0, 1.0, 1.0], [[math.log(0.8)], [math.log(0.4)], [-0.1], [-0.2]], groups=[0, 0, 1, 1])
    w = codapo_weights(b, w_min=0.5, w_max=2.0, threshold=0.5).tolist()
    assert w == pytest.approx([0.5 + 1.5 * 1.0 * 0.4] * 2 + [0.5] * 2)  # p = 1/2, c = 0.6; solved group
    assert codapo(b)[:2, 1].tolist() == pytest.approx([A2 * 1.1, -A2 * 1.1], rel=1e-5)


LOGP = st.floats(-6, -0.01, allow_nan=False)


@st.composite
def credit_batches(draw) -> Batch:
    groups = draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=4), min_size=1, max_size=3))
    rewards = [r for g in groups for r in g]
    lps = [draw(st.lists(LOGP, min_size=1, max_size=5)) for _ in rewards]
    toks = [draw(st.lists(st.integers(3, 8), min_size=len(lp), max_size=len(lp))) for lp in lps]
    return batch_of(rewards, lps, [i for i, g in enumerate(groups) for _ in g], toks)


@FAST
@given(credit_batches(), st.floats(0, 2))
def test_ah_grpo_only_shrinks_and_keeps_sign_and_tied_groups_stay_zero(b, alpha):
    base, got = grpo(b), ah_grpo(b, alpha=alpha)
    assert bool((got.abs() <= base.abs() + 1e-6).all()) and bool((got * base >= 0).all())
    for fn in (ah_grpo, rredcot, graphae, codapo):
        out = fn(b)
        assert bool((out[base == 0] == 0).all()), fn.__name__
        assert bool((out[b.loss_mask == 0] == 0).all())


@FAST
@given(credit_batches(), st.integers(1, 3))
def test_rredcot_conserves_each_rollouts_total_credit(b, seg):
    base, got = grpo(b), rredcot(b, segment_len=seg)
    assert got.sum(dim=1).tolist() == pytest.approx(base.sum(dim=1).tolist(), abs=1e-4)
    assert bool((got * base >= 0).all())


@FAST
@given(credit_batches(), st.floats(0, 1), st.floats(1, 3))
def test_codapo_weight_is_bounded_and_ispo_only_lowers_wrong_rollouts(b, w_min, w_max):
    w = codapo_weights(b, w_min=w_min, w_max=w_max, threshold=0.5)
    assert bool((w >= w_min - 1e-9).all() and (w <= w_max + 1e-9).all())
    diff = ispo(b) - grpo(b)
    assert bool((diff <= 1e-6).all()) and bool((diff[b.rewards >= 0.5] == 0).all())


def test_registered_as_grouped_and_bad_options_are_config_errors():
    for name in ("ah_grpo", "rredcot", "graphae", "consteer", "ispo", "codapo"):
        assert ADVANTAGES.get(name).traits.grouped is True
    b = batch_of([1.0, 0.0], [[-1.0], [-1.0]])
    for fn, bad in ((ah_grpo, {"alpha": -1}), (rredcot, {"segment_len": 0}), (graphae, {"lam": 2}),
                    (consteer, {"beta": -1}), (ispo, {"tau": 1.0}), (codapo, {"w_min": 3.0})):
        with pytest.raises(ConfigError):
            fn(b, **bad)


def test_an_extra_pass_gets_the_advantages_own_answer_region():
    """The RL trainer gives a features pass the bound advantage's options it also takes (ISPO's answer_tokens as
    configured, not its default; nothing to a source that takes none), and a salience pass the configured
    answer region (FlowTracer's)."""
    from upslope.train.learner.salience import FEATURES
    from upslope.train.trainers.rl import bound_options, shared_options

    ispo = ADVANTAGES.bind("ispo", {"answer_tokens": 7}, where="algo.advantage.options")
    assert shared_options(ispo, FEATURES["answer_gain"]) == {"answer_tokens": 7}
    assert shared_options(ADVANTAGES.bind("geoalign", {}, where="o"), FEATURES["hidden_mean"]) == {}
    assert shared_options(ADVANTAGES.bind("infuser", {}, where="o"), FEATURES["influence"]) == {}
    assert bound_options(ADVANTAGES.bind("flowtracer", {"answer_tokens": 5}, where="o"))["answer_tokens"] == 5
    assert bound_options(ADVANTAGES.bind("flowtracer", {}, where="o"))["answer_tokens"] == 3  # its default
