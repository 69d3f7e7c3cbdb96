"""The single stages on hand-built batches with hand-computed results: filter, overlong mask,
KL penalty in the reward, critic values and GAE returns, advantage; and the rollout stage on the
real HF engine. Every stage returns a new Batch and leaves its input as it was."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from upslope.rollout.plugin import single_turn
from upslope.algos.kl import kl_penalty_in_reward
from upslope.batch import Batch, build_batch
from upslope.data.types import Example
from upslope.registry import ADVANTAGES, FILTERS, KL_ESTIMATORS
from upslope.engine import SamplingParams
from upslope.train import stages


def batch_of(rewards: list[float], groups: list[int], lens: list[int], truncated: list[bool] | None = None) -> Batch:
    """One prompt token [1] per row, completions of the given lengths (tokens 5, 6, ...)."""
    comps = [list(range(5, 5 + n)) for n in lens]
    b = build_batch([[1]] * len(lens), comps, [[-1.0] * n for n in lens], groups,
                    truncated or [False] * len(lens), pad_id=0)
    b.rewards = torch.tensor(rewards)
    return b


def test_nonzero_std_filter_drops_whole_flat_groups_and_keeps_order():
    b = batch_of([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2], [1, 2, 3, 1, 2, 3])
    out = stages.apply_filters(b, [FILTERS.bind("nonzero_std")])
    assert out.group_ids.tolist() == [1, 1] and out.rewards.tolist() == [0.0, 1.0]
    assert out.input_ids.shape[1] == 4  # trimmed to its longest row (prompt 1 + 3 tokens)
    every = batch_of([0.0, 1.0], [0, 0], [1, 1])
    assert stages.apply_filters(every, [FILTERS.bind("nonzero_std")]) is every  # nothing dropped: no copy
    assert stages.apply_filters(every, []) is every


def test_two_filters_keep_only_what_both_keep():
    b = batch_of([0.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], [2, 2, 2, 2], truncated=[False, False, True, False])
    out = stages.apply_filters(b, [FILTERS.bind("nonzero_std"), FILTERS.bind("max_length")])
    assert out.group_ids.tolist() == [0, 0]  # group 1 has a truncated completion


def test_mask_truncated_zeroes_exactly_the_truncated_rows():
    b = batch_of([1.0, 0.0], [0, 0], [2, 3], truncated=[True, False])
    out = stages.mask_truncated(b)
    assert out.loss_mask.tolist() == [[0, 0, 0, 0], [0, 1, 1, 1]]
    assert b.loss_mask.tolist() == [[0, 1, 1, 0], [0, 1, 1, 1]]  # input unchanged


def test_kl_penalty_in_reward_by_hand():
    """k1 KL = old - ref per token: row 0 tokens (0.2, -0.1), row 1 token 0.3; beta 0.5."""
    b = batch_of([1.0, 0.0], [0, 0], [2, 1])
    b.old_logprobs = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, 0.0]])
    b.ref_logprobs = torch.tensor([[0.0, -1.2, -1.9], [0.0, -1.3, 0.0]])
    out, kl = kl_penalty_in_reward(b, KL_ESTIMATORS.bind("k1"), 0.5)
    assert out.rewards.tolist() == pytest.approx([1.0 - 0.5 * 0.1, 0.0 - 0.5 * 0.3])
    # the outcome reward sits on the last trained token; every trained token pays beta * its KL
    assert out.token_rewards.tolist() == [pytest.approx([0.0, -0.1, 1.0 + 0.05]), pytest.approx([0.0, -0.15, 0.0])]
    assert kl == pytest.approx((0.2 - 0.1 + 0.3) / 3)
    assert b.rewards.tolist() == [1.0, 0.0] and b.token_rewards is None  # input unchanged


def test_critic_values_then_gae_returns_by_hand():
    """The critic's values are stored; the `critic=True` advantage (gae) then sets the returns once:
    gamma 1, lam 1: the return of every trained token is the outcome reward (no discount), whatever
    the values; gamma 0.5: each step back halves it; lam 0: one-step TD targets."""
    b = batch_of([2.0], [0], [3])
    values = torch.tensor([[0.0, 0.3, -0.7, 1.1]])
    with_values = replace(b, values=values)
    assert torch.equal(with_values.values, values) and b.values is None and with_values.returns is None

    def returns(gamma: float, lam: float) -> list[list[float]]:
        gae = ADVANTAGES.bind("gae", {"gamma": gamma, "lam": lam, "whiten": False})
        out = stages.advantage(with_values, gae)
        assert with_values.returns is None  # a new batch; the input is untouched
        return out.returns.tolist()

    assert returns(1.0, 1.0) == [pytest.approx([0.0, 2.0, 2.0, 2.0])]
    assert returns(0.5, 1.0) == [pytest.approx([0.0, 0.5, 1.0, 2.0])]
    assert returns(1.0, 0.0) == [pytest.approx([0.0, -0.7, 1.1, 2.0])]


def test_advantage_is_masked_to_trained_tokens():
    b = batch_of([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1], [1, 2, 2, 1])
    out = stages.advantage(b, ADVANTAGES.bind("grpo"))
    # group 0: rewards (1, 0), sample std 0.7071 -> +-0.7071 on each trained token; group 1 flat -> 0
    a = 1 / 2 ** 0.5
    assert out.advantages[0].tolist() == pytest.approx([0.0, a, 0.0], abs=1e-4)
    assert out.advantages[1].tolist() == pytest.approx([0.0, -a, -a], abs=1e-4)
    assert out.advantages[2:].abs().sum() == 0
    assert b.advantages is None


def test_rollout_stage_on_the_real_engine(hf_engine, encode_chat):
    """Two prompts x 3 completions: one group per prompt (offset), prompt then completion tokens,
    loss mask on exactly the completion, the engine's log-probs aligned to their tokens."""
    questions = ["What is 2 + 2?", "Name a colour."]
    prompts = encode_chat(questions)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=7, stop_token_ids=[2])
    b = single_turn(hf_engine, prompts, [Example(prompt=q, answer=str(i)) for i, q in enumerate(questions)],
                    params, pad_id=2, group_offset=10)
    assert b.size == 6 and b.group_ids.tolist() == [10, 10, 10, 11, 11, 11]
    for i in range(b.size):
        p, s = int(b.prompt_lens[i]), int(b.seq_lens[i])
        assert b.input_ids[i, :p].tolist() == prompts[i // 3]
        assert b.loss_mask[i].nonzero().flatten().tolist() == list(range(p, s))
        assert (b.sampler_logprobs[i, p:s] <= 0).all() and (b.sampler_logprobs[i, :p] == 0).all()
        m = b.meta[i]
        assert m["answer"] == str(i // 3) and m["completion_tokens"] == s - p <= 5
        assert bool(b.truncated[i]) == (m["finish_reason"] == "length")
        assert bool(b.truncated[i]) or b.input_ids[i, s - 1] == 2  # a finished completion ends with its stop token
    assert b.policy_version.tolist() == [hf_engine.version] * 6
