"""OPERA's perplexity-drop reward on the real tokenizer with hand-set log-probs, and the reward stage
handing a `logprobs=True` reward the sampler's log-probs of each completion token."""
from __future__ import annotations

import pytest
import torch

from batch_helpers import score_and_check

from upslope.batch import build_batch
from upslope.config import RewardSpec
from upslope.errors import ConfigError
from upslope.registry import REWARD_COMBINERS, REWARDS
from upslope.rewards import build_reward_fns
from upslope.rewards.context import RewardContext
from upslope.rewards.perplexity import opera, uncertainty_drops

TEXT = "1 + 2 is 4 wait it is 3"


def test_uncertainty_drops_by_hand():
    lps = [-2.0, -2.0, -1.0, -0.5, -0.1, -0.1]
    # at t = 3, window 2: before (-2, -1) mean NLL 1.5, after (-0.5, -0.1) mean NLL 0.3: a drop of 1.2
    assert uncertainty_drops(lps, [3], 2) == pytest.approx([1.2])
    assert uncertainty_drops(lps, [0, 6], 2) == []  # nothing before the first token, nothing after the last
    assert uncertainty_drops(lps, [1], 8) == pytest.approx([2.0 - (2.0 + 1.0 + 0.5 + 0.1 + 0.1) / 5])


def test_opera_finds_the_cue_token_and_rewards_the_drop(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    cue = pieces.index(" wait")
    lps = [-3.0] * cue + [-0.5] * (len(ids) - cue)  # unsure before the reflection, sure from it on
    ctx = RewardContext(policy_tokenizer=tokenizer)
    got = opera([TEXT], [3], [{}], ctx, token_ids=[ids], logprobs=[lps], window=2)
    assert got == pytest.approx([3.0 - 0.5])
    assert opera(["1 + 2 is 3"], [3], [{}], ctx, token_ids=[tokenizer("1 + 2 is 3")["input_ids"]],
                 logprobs=[[-1.0] * 5], window=2) == [0.0]  # no reflective cue
    two = f"{TEXT}. Hmm, yes 3"
    ids2 = tokenizer(two, add_special_tokens=False)["input_ids"]
    p2 = [tokenizer.decode([i]) for i in ids2]
    lps2 = [-3.0] * p2.index(" wait") + [-1.0] * (p2.index(" Hmm") - p2.index(" wait")) + \
        [-0.5] * (len(ids2) - p2.index(" Hmm"))
    drops = [3.0 - 1.0, 1.0 - 0.5]  # a window of 1 token on each side of each cue
    assert opera([two], [3], [{}], ctx, token_ids=[ids2], logprobs=[lps2], window=1) == pytest.approx([sum(drops) / 2])
    assert opera([two], [3], [{}], ctx, token_ids=[ids2], logprobs=[lps2], window=1, aggregate="sum") == \
        pytest.approx([sum(drops)])


def test_the_reward_stage_gives_the_sampler_logprobs(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    cue = [tokenizer.decode([i]) for i in ids].index(" wait")
    lps = [-3.0] * cue + [-0.5] * (len(ids) - cue) + [-0.25]  # and the end token's
    comp = ids + [tokenizer.eos_token_id]
    batch = build_batch([[1, 2]], [comp], [lps], [0], [False], tokenizer.pad_token_id,
                        meta=[{"answer": 3, "completion": TEXT}])
    fns = build_reward_fns([RewardSpec(name="opera", options={"window": 2})], context=RewardContext(tokenizer))
    assert fns[0].logprobs and REWARDS.get("opera").traits.logprobs
    out, _ = score_and_check(batch, fns, REWARD_COMBINERS.bind("weighted_sum"))
    assert out.rewards.tolist() == pytest.approx([2.5])
    assert torch.equal(out.sampler_logprobs, batch.sampler_logprobs)


def test_opera_without_the_tokenizer_or_logprobs_is_one_line():
    with pytest.raises(ConfigError, match="needs the policy's tokenizer and the sampler's log-probs"):
        opera(["wait"], [1], [{}], RewardContext())


def test_a_logprobs_reward_must_be_batched():
    from upslope.registry import RewardTraits

    with pytest.raises(TypeError, match="logprobs=True needs batched=True"):
        RewardTraits(logprobs=True).check("per_sample", lambda completion, answer, meta: 0.0)
    RewardTraits(logprobs=True, batched=True).check("batched", lambda completions, answers, metas: [])
