"""E3RL's erasure points and ReSum's summary points against hand-made completions, and both rollouts on the
tiny model: each sampled completion followed by its sibling, the kept prefix shared, forced tokens untrained,
the pair a two-leaf tree whose segment credit (advantage `tree`) is checked by hand."""
from __future__ import annotations

import random

import pytest
import torch

from upslope.data.types import Example
from upslope.engine import Completion, SamplingParams
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, ROLLOUTS
from upslope.rollout.branching import Branch, erase_points, segment_ce, summary_points


def comp(logprobs, tokens=None, text=""):
    return Completion(tokens or [5] * len(logprobs), logprobs, text, "stop")


def test_segment_cross_entropy_and_the_adaptive_threshold_by_hand():
    """Segments of 2: CE [1, 3] and [1, 1]; over the round mean 1.5, std 1 (unbiased): with k = 1 the threshold
    is 2.5, so the first completion's second segment is erased (branch at token 2) and the second completion,
    with no segment above it, gets a fresh sibling (branch at 0); with k = 2 (3.5) nothing is erased."""
    assert segment_ce([-1.0, -1.0, -3.0, -3.0, -2.0], 2) == [1.0, 3.0, 2.0]
    groups = [[comp([-1.0, -1.0, -3.0, -3.0]), comp([-1.0] * 4)]]
    assert erase_points(groups, 2, 1.0) == [[Branch(2, kind="erased"), Branch(0, kind="fresh")]]
    assert erase_points(groups, 2, 2.0) == [[Branch(0, kind="fresh"), Branch(0, kind="fresh")]]


def test_summary_points_mask_a_written_summary_and_inject_one_elsewhere(tokenizer):
    said = "12 + 5 = 17. In summary, 17"
    ids = tokenizer(said, add_special_tokens=False)["input_ids"]
    plain = tokenizer("12 + 5 = 17", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=2, max_new_tokens=16)
    [[masked, injected]] = summary_points([[comp([-1.0] * len(ids), ids, said), comp([-1.0] * len(plain), plain,
                                           "12 + 5 = 17")]], tokenizer, params, " In summary,", random.Random(0))
    assert tokenizer.decode(ids[:masked.point]) == "12 + 5 = 17." and masked.forced == () and masked.kind == "masked"
    forced = tuple(tokenizer.encode(" In summary,", add_special_tokens=False))
    assert injected.forced == forced and injected.kind == "injected"
    assert 0 <= injected.point <= min(len(plain), 16 - len(forced) - 1)
    with pytest.raises(ConfigError, match="leave no room"):
        summary_points([[comp([-1.0] * 3)]], tokenizer, SamplingParams(max_new_tokens=len(forced)), " In summary,",
                       random.Random(0))


def check_pairs(batch, n_pairs):
    """Each pair (rows 2p, 2p + 1) shares the completion's tokens up to its branch point; returns the points."""
    points = []
    for p in range(n_pairs):
        a, b = 2 * p, 2 * p + 1
        ta, tb = batch.meta[a]["tree"], batch.meta[b]["tree"]
        assert ta["ends"] == tb["ends"] and ta["nodes"][0] == tb["nodes"][0] and ta["nodes"][1] != tb["nodes"][1]
        point, start = ta["ends"][0], int(batch.prompt_lens[a])
        assert torch.equal(batch.input_ids[a, :start + point], batch.input_ids[b, :start + point])
        points.append(point)
    return points


def test_e3rl_rollout_on_the_tiny_model(hf_engine, encode_chat):
    prompts = encode_chat(["What is 2 + 3?", "What is 7 + 1?"])
    examples = [Example(prompt="q", answer=5), Example(prompt="q", answer=8)]
    params = SamplingParams(n=4, max_new_tokens=12, seed=3)
    batch = ROLLOUTS.bind("e3rl", {"segment_len": 3, "k": 0.5})(hf_engine, prompts, examples, params, pad_id=0)
    assert batch.size == 8 and batch.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    points = check_pairs(batch, 4)
    originals = [[comp(batch.sampler_logprobs[i, int(batch.prompt_lens[i]):int(batch.seq_lens[i])].tolist())
                  for i in (g, g + 2)] for g in (0, 4)]
    assert [b.point for grp in erase_points(originals, 3, 0.5) for b in grp] == points  # the rule, recomputed
    with pytest.raises(ConfigError, match="rollout.n must be even"):
        ROLLOUTS.bind("e3rl")(hf_engine, prompts, examples, SamplingParams(n=3), pad_id=0)


def test_resum_rollout_forces_the_phrase_untrained_and_the_tree_credits_the_pair(hf_engine, encode_chat, tokenizer):
    prompts = encode_chat(["What is 2 + 3?"])
    params = SamplingParams(n=4, max_new_tokens=12, seed=1)
    batch = ROLLOUTS.bind("resum")(hf_engine, prompts, [Example(prompt="q", answer=5)], params, pad_id=0)
    points = check_pairs(batch, 2)
    forced = tokenizer.encode(" In summary,", add_special_tokens=False)
    assert any(m["metrics"].get("resum/injected") for m in batch.meta)  # the tiny model writes no summary itself
    for p, point in enumerate(points):
        row, start = 2 * p + 1, int(batch.prompt_lens[2 * p + 1]) + point
        if batch.meta[row]["metrics"].get("resum/injected"):
            assert batch.input_ids[row, start:start + len(forced)].tolist() == forced
            assert batch.loss_mask[row, start:start + len(forced)].sum() == 0
            assert batch.sampler_logprobs[row, start:start + len(forced)].abs().sum() == 0
    # rewards 1, 0 (pair 0) and 0, 0 (pair 1): the prefixes get the group's +-0.7071 (node values 0.5, 0), pair 0's
    # branches +-0.7071 against each other, pair 1's tied branches 0
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = ADVANTAGES.bind("tree")(batch)
    s = 2 ** -0.5
    for row, (pre, post) in enumerate([(s, s), (s, -s), (-s, 0.0), (-s, 0.0)]):
        start, end, point = int(batch.prompt_lens[row]), int(batch.seq_lens[row]), points[row // 2]
        trained = batch.loss_mask[row] > 0
        want = torch.zeros(batch.input_ids.shape[1])
        want[start:start + point], want[start + point:end] = pre, post
        assert torch.allclose(adv[row][trained], want[trained], atol=1e-4), row
