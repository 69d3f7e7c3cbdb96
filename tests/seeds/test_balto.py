"""BALTO against hand computations: the claims reward's verdicts and where they are placed, the token labels
read back from the placed parts, and the balanced label term beside the group-normalised outcome."""
from __future__ import annotations

import pytest
import torch
from batch_helpers import score_and_check

from upslope.algos.credit import balto, span_labels
from upslope.batch import build_batch
from upslope.config import RewardSpec
from upslope.errors import ConfigError
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns
from upslope.rewards.claims import claims, evaluate, verdict
from upslope.rewards.placement import PlacedReward


def test_claims_are_verified_and_placed_where_they_end():
    text = "12 + 34 = 46. 5 x 5 = 24. So #### 46"
    # claim 1 '12 + 34 = 46.' holds (ends at 13), claim 2 ' 5 x 5 = 24.' does not (ends at 25), ' So #### 46' has
    # no equation: two checkable claims, +-1/2 each, 0 as a sequence reward
    assert claims(text, 46, {}) == PlacedReward(((13, 0.5), (25, -0.5)))
    assert float(claims(text, 46, {})) == 0.0
    assert claims("#### 46", 46, {}) == 0.0  # nothing checkable
    assert evaluate("7 - 2 * 3") == 1.0 and evaluate("4 / 0") is None and evaluate("__import__('os')") is None
    assert verdict("2 + 2 = 4 and 3 + 3 = 7", "arithmetic", "") is False  # every equation of a claim must hold
    assert verdict("1.5 + 2 = 7", "arithmetic", "") is None  # a decimal is not an integer equation's operand


def test_claims_grounded_in_a_context_field():
    meta = {"context": "Ann bought 3 apples for 12 dollars."}
    got = claims("She bought 3 apples. They cost 15 dollars.\nThat is all", None, meta, check="context")
    assert got == PlacedReward(((20, 0.5), (42, -0.5)))
    with pytest.raises(ValueError, match="needs the meta field 'passage'"):
        claims("3 apples.", None, meta, check="context", context_field="passage")


def labelled_group():
    """One group of two rows after a 1-token prompt, 5 completion tokens each: row 0 has a supported claim
    ending at completion token 1 and an unsupported one ending at 3 (token 4 unlabelled); row 1 one supported
    claim ending at token 2."""
    b = build_batch([[7], [7]], [[5] * 5, [5] * 5], [[-1.0] * 5] * 2, [0, 0], [False, False], pad_id=0)
    b.rewards = torch.tensor([1.0, 0.0])
    b.reward_components = {"correct": torch.tensor([1.0, 0.0]), "claims": torch.tensor([0.0, 1.0])}
    tr = torch.zeros(2, 6)
    tr[0, 2], tr[0, 4], tr[1, 3] = 0.5, -0.5, 1.0
    b.token_rewards = tr
    return b


def test_span_labels_by_hand():
    b = labelled_group()
    assert span_labels(b.token_rewards, b.loss_mask).tolist() == [[0, 1, 1, -1, -1, 0], [0, 1, 1, 1, 0, 0]]
    b.token_rewards[1, 5] = 3e-8  # the float32 rounding of a reward's sum, left on the last token: no label
    assert span_labels(b.token_rewards, b.loss_mask).tolist()[1] == [0, 1, 1, 1, 0, 0]


def test_balanced_label_term_by_hand():
    """Supported tokens 5, unsupported 2, T = 7: +7/10 on each supported, -7/4 on each unsupported token; the
    label term sums to 0 over the group. Outcome: rewards 1, 0 give +-0.5 / (std + 1e-6)."""
    b = labelled_group()
    o = 0.5 / (2 ** -0.5 + 1e-6)
    p, n = 0.7, -1.75
    want = torch.tensor([[0, o + p, o + p, o + n, o + n, o], [0, -o + p, -o + p, -o + p, -o, -o]])
    assert torch.allclose(balto(b), want.float(), atol=1e-5)
    only_labels = balto(b, outcome_coef=0.0)
    assert float(only_labels.sum()) == pytest.approx(0.0, abs=1e-5)
    assert torch.allclose(balto(b, outcome="claims", label_coef=0.0)[1, 1:], torch.full((5,), o), atol=1e-5)


def test_a_group_with_one_class_of_labels_gets_no_label_term():
    b = labelled_group()
    b.token_rewards = b.token_rewards.abs()  # every claim supported
    assert torch.equal(balto(b), balto(b, label_coef=0.0))
    b.token_rewards = None  # nothing placed: GRPO on the outcome
    o = 0.5 / (2 ** -0.5 + 1e-6)
    assert torch.allclose(balto(b)[:, 1:], torch.tensor([[o] * 5, [-o] * 5]), atol=1e-5)
    with pytest.raises(ConfigError, match="no reward component 'faithful'"):
        balto(b, outcome="faithful")


def test_the_reward_stage_labels_each_claims_tokens(tokenizer):
    """Through the reward stage with the real tokenizer: the verdicts land on the tokens where the claims end,
    and the labels read back cover each claim's own tokens."""
    text = "2 + 2 = 4. 3 + 3 = 7."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    first_end = next(k for k in range(len(ids)) if len(tokenizer.decode(ids[:k + 1])) >= 10)
    comps = [ids + [tokenizer.eos_token_id]]
    batch = build_batch([[1, 2]], comps, [[0.0] * len(comps[0])], [0], [False], tokenizer.pad_token_id,
                        meta=[{"answer": 4, "completion": text}])
    fns = build_reward_fns([RewardSpec(name="claims")])
    out, _ = score_and_check(batch, fns, REWARD_COMBINERS.bind("weighted_sum"), 0.0, tokenizer=tokenizer)
    labels = span_labels(out.token_rewards, out.loss_mask)[0, 2:].tolist()
    assert labels == [1.0] * (first_end + 1) + [-1.0] * (len(ids) - first_end - 1) + [0.0]  # the end token: none
