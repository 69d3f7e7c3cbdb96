"""Filters, the overlong loss mask, reward combiners, the overlong-penalty reward, and registration."""
import pytest
import torch
from algos_strategies import batches, make_batch
from hypothesis import given, settings

import upslope.algos  # noqa: F401  (registers everything)
from upslope.algos.combiners import group_normalized_sum, weighted_sum
from upslope.algos.filters import max_length, nonzero_std, overlong_mask
from upslope.errors import ConfigError, DataError
from upslope.registry import (ADVANTAGES, FILTERS, KL_ESTIMATORS, POLICY_LOSSES, REWARD_COMBINERS, REWARDS)
from upslope.rewards.length import overlong_penalty

FAST = settings(max_examples=60, deadline=None)


def test_nonzero_std_hand_example():
    b = make_batch([[1.0, 1.0], [0.0, 1.0], [5.0]], comp_lens=[1] * 5)
    assert nonzero_std(b).tolist() == [False, False, True, True, False]  # a singleton group has no spread
    b.rewards = torch.tensor([1.0, 1.05, 0.0, 1.0, 5.0])
    assert nonzero_std(b, tol=0.1).tolist() == [False, False, True, True, False]


@FAST
@given(batches())
def test_filters_keep_whole_groups(b):
    for keep in (nonzero_std(b), max_length(b)):
        for g in b.group_ids.unique():
            assert keep[b.group_ids == g].unique().numel() == 1


def test_max_length_and_overlong_mask():
    b = make_batch([[1.0, 0.0], [1.0, 0.0]], comp_lens=[2, 2, 2, 2], truncated=[False, True, False, False])
    assert max_length(b).tolist() == [False, False, True, True]
    assert max_length(b, scope="sample").tolist() == [True, False, True, True]
    lm = overlong_mask(b)
    assert lm[1].sum() == 0 and torch.equal(lm[[0, 2, 3]], b.loss_mask[[0, 2, 3]])
    with pytest.raises(ConfigError):
        FILTERS.bind("max_length", {"scope": "batch"})


def test_combiners_hand_example():
    comps = {"a": torch.tensor([1.0, 0.0, 0.0, 1.0]), "b": torch.tensor([0.0, 0.0, 0.0, 1.0])}
    gid = torch.zeros(4, dtype=torch.long)
    assert torch.allclose(weighted_sum(comps, gid), torch.tensor([1.0, 0.0, 0.0, 2.0]))
    assert torch.allclose(weighted_sum(comps, gid, weights={"a": 0.5, "b": 2.0}), torch.tensor([0.5, 0.0, 0.0, 2.5]))
    h = 3 ** 0.5 / 2  # a -> +-sqrt(3)/2 ; b -> [-0.5, -0.5, -0.5, 1.5] (sample std 0.5)
    assert torch.allclose(group_normalized_sum(comps, gid), torch.tensor([h - 0.5, -h - 0.5, -h - 0.5, h + 1.5]),
                          atol=1e-5)
    with pytest.raises(ConfigError):
        weighted_sum(comps, gid, weights={"typo": 1.0})


@pytest.mark.parametrize("n, expect", [(0, 0.0), (6, 0.0), (7, -0.25), (8, -0.5), (10, -1.0), (11, -1.0)])
def test_overlong_penalty(n, expect):
    # max 10, buffer 4: 0 up to 6 tokens, linear to -1 at 10, -1 beyond
    assert overlong_penalty("", None, {"completion_tokens": n}, max_length=10, buffer=4) == pytest.approx(expect)
    assert overlong_penalty("", None, {"completion_tokens": n, "max_new_tokens": 10}, buffer=4) == pytest.approx(expect)


def test_overlong_penalty_edges():
    assert overlong_penalty("", None, {"completion_tokens": 10, "max_new_tokens": 10}) == 0.0  # no buffer: hard limit
    assert overlong_penalty("", None, {"completion_tokens": 11, "max_new_tokens": 10}) == -1.0
    with pytest.raises(DataError):
        overlong_penalty("", None, {"max_new_tokens": 10})
    with pytest.raises(DataError):
        overlong_penalty("", None, {"completion_tokens": 3})


def test_registered_names_and_option_checking():
    assert set(ADVANTAGES.names()) >= {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gae", "gdpo"}
    assert set(POLICY_LOSSES.names()) >= {"ppo_clip", "gspo", "cispo", "reinforce"}
    assert set(KL_ESTIMATORS.names()) >= {"k1", "k2", "k3"}
    assert set(FILTERS.names()) >= {"nonzero_std", "max_length"}
    assert set(REWARD_COMBINERS.names()) >= {"weighted_sum", "group_normalized_sum"}
    assert "overlong_penalty" in REWARDS
    with pytest.raises(ConfigError, match="eps_high"):
        POLICY_LOSSES.bind("ppo_clip", {"eps_hihg": 0.28})
    with pytest.raises(ConfigError):
        ADVANTAGES.bind("grpo", {"scale_by_std": "maybe"})
    assert ADVANTAGES.bind("gdpo", {"weights": {"a": "2"}}).keywords["weights"] == {"a": 2.0}
    for reg in (ADVANTAGES, POLICY_LOSSES, KL_ESTIMATORS, FILTERS, REWARD_COMBINERS):
        for name in reg.names():
            assert reg.get(name).doc, f"{reg.kind} {name} has no one-line docstring"
