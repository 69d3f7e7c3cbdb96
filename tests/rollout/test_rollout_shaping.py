"""ESPO and DenoiseRL rollouts: the stopping rule and the noisy prefix against
hand-computed cases, then both rollouts on the real HF engine (tiny model, SmolLM2 tokenizer)."""
from __future__ import annotations

import math

import random
from pathlib import Path

import torch

from batch_helpers import score_and_check

from upslope.rollout.plugin import single_turn
from upslope.data.types import Example
from upslope.registry import REWARD_COMBINERS, ROLLOUTS
from upslope.rewards import RewardFn
from upslope.engine import SamplingParams
from upslope.rollout.shaping import espo_stop, noisy_prefix


def test_espo_stop_by_hand():
    """mu 1, sd 1, margin 1: regrets 0, 0, 4, 4 -> cumulative 0, 0, 4, 8 against sqrt(t) = 1, 1.41, 1.73:
    stops after token 3; with min_tokens 4 only after token 4 (8 > 2); flat surprisal never stops."""
    lps = [-1.0, -1.0, -5.0, -5.0]
    assert espo_stop(lps, 1.0, 1.0, margin=1.0, min_tokens=1) == 3
    assert espo_stop(lps, 1.0, 1.0, margin=1.0, min_tokens=4) == 4
    assert espo_stop([-1.0] * 6, 1.0, 1.0, margin=0.0, min_tokens=1) is None
    assert espo_stop(lps, 1.0, 1.0, margin=5.0, min_tokens=1) is None  # 8 < 5 x 2


def test_noisy_prefix_by_hand():
    rng = random.Random(0)
    assert noisy_prefix([1, 2, 3, 4], [9], length=3, noise=0.0, rng=rng) == [1, 2, 3]
    assert noisy_prefix([1, 2, 3, 4], [9], length=3, noise=1.0, rng=rng) == [9, 9, 9]
    assert noisy_prefix([1, 2], [], length=2, noise=1.0, rng=rng) == [1, 2]  # nothing to swap in


def _examples(encode_chat):
    qs = ["What is 12 + 30?", "What is 7 + 8?"]
    return encode_chat(qs), [Example(prompt=q, answer=a) for q, a in zip(qs, ["42", "15"])]


def test_espo_rollout_stops_and_fails_on_the_real_engine(hf_engine, encode_chat):
    """margin -1e9 stops every completion longer than min_tokens there, as a terminal failure whatever
    the text scores; margin 1e9 stops none and equals the plain rollout with the same seed."""
    prompts, examples = _examples(encode_chat)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=3, stop_token_ids=[2])
    plain = single_turn(hf_engine, prompts, examples, params, pad_id=2)
    never = ROLLOUTS.bind("espo", {"margin": 1e9})(hf_engine, prompts, examples, params, 2)
    assert torch.equal(never.input_ids, plain.input_ids) and bool(never.reward_override.isnan().all())
    always = ROLLOUTS.bind("espo", {"margin": -1e9, "min_tokens": 2, "fail_reward": -1.0})(
        hf_engine, prompts, examples, params, 2)
    for i, m in enumerate(always.meta):
        full = int(plain.completion_lens[i])
        assert int(always.completion_lens[i]) == min(full, 2)
        assert m["metrics"]["espo/stopped"] == float(full > 2) and m["metrics"]["espo/saved_tokens"] == max(full - 2, 0)
        assert (float(always.reward_override[i]) == -1.0) == (full > 2)
    one = [RewardFn("one", 1.0, lambda c, a, m: 1.0)]
    scored, _ = score_and_check(always, one, REWARD_COMBINERS.bind("weighted_sum"), 0.0)
    expect = [1.0 if v.isnan() else -1.0 for v in always.reward_override]
    assert scored.rewards.tolist() == expect and scored.reward_components["one"].tolist() == [1.0] * always.size


def test_reward_scale_from_the_rollout_by_hand():
    """batch.reward_scale multiplies the combined reward; batch.reward_override replaces it where not NaN."""
    from dataclasses import replace

    from upslope.batch import build_batch

    b = build_batch([[1], [1], [1]], [[5], [5], [5]], [[-0.1]] * 3, [0, 0, 0], [False] * 3, 2,
                    meta=[{"completion": "x", "answer": None}] * 3)
    b = replace(b, reward_scale=torch.tensor([1.0, 0.25, 0.25]),
                reward_override=torch.tensor([math.nan, math.nan, 0.0]))
    out, _ = score_and_check(b, [RewardFn("two", 1.0, lambda c, a, m: 2.0)], REWARD_COMBINERS.bind("weighted_sum"), 0.0)
    assert out.rewards.tolist() == [2.0, 0.5, 0.0]


def test_denoise_rollout_restarts_from_an_untrained_prefix(hf_engine, encode_chat):
    """n 4, share 0.5: the last two of each group restart from the first half of their own sample (noise 0:
    unchanged tokens); the prefix has loss_mask 0 and sampler log-prob 0, the continuation is trained."""
    prompts, examples = _examples(encode_chat)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=5, stop_token_ids=[2])
    plain = single_turn(hf_engine, prompts, examples, params, pad_id=2)
    b = ROLLOUTS.bind("denoise", {"share": 0.5, "prefix_frac": 0.5, "noise": 0.0})(
        hf_engine, prompts, examples, params, 2)
    assert b.group_ids.tolist() == [0] * 4 + [1] * 4
    for i in range(b.size):
        p, s, k = int(b.prompt_lens[i]), int(b.seq_lens[i]), b.meta[i]["denoise_prefix"]
        if i % 4 < 2:
            assert k == 0 and torch.equal(b.input_ids[i, :s], plain.input_ids[i, :s])
            continue
        full = int(plain.completion_lens[i])
        assert k == max(1, int(0.5 * full))
        assert b.input_ids[i, p:p + k].tolist() == plain.input_ids[i, p:p + k].tolist()
        assert b.loss_mask[i, p:p + k].sum() == 0 and b.loss_mask[i, p + k:s].sum() == s - p - k > 0
        assert (b.sampler_logprobs[i, p:p + k] == 0).all()


def test_bad_rollout_option_is_one_config_error(tmp_path):
    """A typo in rollout.options fails in the RL trainer's config check, before any model loads."""
    import pytest

    from upslope.config import load_config
    from upslope.errors import ConfigError
    from upslope.train.trainers.rl import check_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / "espo.yaml", [f"run_dir={tmp_path}"])
    cfg.rollout.options = {"marginn": 1.0}
    with pytest.raises(ConfigError, match=r"rollout.options.marginn: unknown option for rollout 'espo' \(did you mean 'margin'\?\)"):
        check_config(cfg)
