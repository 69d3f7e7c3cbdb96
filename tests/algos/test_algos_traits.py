"""Traits declared at registration (grouped, critic, whole_batch) and how the loop and the stages read
them: no advantage name is checked anywhere outside the registry."""
from dataclasses import replace

import pytest
import torch
from algos_strategies import make_batch

from upslope.algos.advantages import gae_advantages_and_returns
from upslope.algos.common import last_token_rewards
from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, FILTERS, REWARD_COMBINERS, REWARDS
from upslope.train import stages
from upslope.train.trainers.rl import check_config, stream_blocker


def test_advantage_traits_are_declared_at_registration():
    grouped = {n for n in ADVANTAGES.names() if ADVANTAGES.get(n).traits.grouped}
    critic = {n for n in ADVANTAGES.names() if ADVANTAGES.get(n).traits.critic}
    assert grouped >= {"grpo", "dr_grpo", "rloo", "gdpo"} and "reinforce_pp" not in grouped
    assert critic >= {"gae"} and not critic & grouped


def test_the_loop_reads_the_grouped_trait():
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        check_config(load_config(None, ["rollout.n=1", "algo.advantage.name=rloo"]))
    check_config(load_config(None, ["rollout.n=1", "algo.advantage.name=reinforce_pp"]))  # not grouped: fine
    # a plugin registered by a user with the trait gets the same check, by trait, not by name
    ADVANTAGES.register("test_traits_grouped", grouped=True)(ADVANTAGES.get("dr_grpo").fn)
    try:
        with pytest.raises(ConfigError, match="test_traits_grouped"):
            check_config(load_config(None, ["rollout.n=1", "algo.advantage.name=test_traits_grouped"]))
    finally:
        ADVANTAGES._entries.pop("test_traits_grouped")


def test_batch_level_steps_declare_the_whole_batch_trait():
    """What uses statistics of the whole batch or round says so: REINFORCE++'s and GAE's whitening,
    GDPO's batch normalisation (and what builds on it), ReCal's per-dataset scale, SAW's batch
    coefficients of variation, DARTS's longest completion, GEOALIGN's consensus directions over the batch,
    GeoMin's Gaussians over the batch's labelled rollouts, PivotTrace's ranking of the batch's prompts, MORE's weights from every group's values;
    DiRL's success direction and RMS novelty, PUM's utility head fitted on the batch's measured prefixes,
    INFUSER's batch z-score of its drafts' scores; group-local estimators do not (Hista: the other rollouts of the same prompt)."""
    def whole(registry):
        return {n for n in registry.names() if registry.get(n).traits.whole_batch}
    assert whole(ADVANTAGES) == {"reinforce_pp", "gae", "gdpo", "gd2po", "recal", "sr_ppo", "geoalign", "geomin",
                                "pivottrace", "dirl", "pum", "infuser", "infuser_difficulty"}
    assert whole(REWARD_COMBINERS) == {"saw", "more"} and whole(FILTERS) == {"darts"}


@pytest.mark.parametrize("extra, reason", [
    ([], None),
    (["algo.filters=[{name: nonzero_std}]"], None),  # DAPO's dynamic sampling streams
    (["algo.advantage.name=reinforce_pp"], "advantage 'reinforce_pp' uses statistics of the whole batch"),
    (["algo.advantage.name=gdpo"], "advantage 'gdpo' uses statistics of the whole batch"),
    (["algo.reward_combiner.name=saw"], "reward combiner 'saw'"),
    (["algo.filters=[{name: darts}]"], "filter 'darts'"),
    (["train.updates_per_batch=2"], "several optimiser steps per batch"),
    (["train.epochs_per_batch=2"], "several optimiser steps per batch"),
    (["algo.replay.name=rerule"], "algo.replay"),
    (["pipeline.stream=false"], "pipeline.stream=false"),
])
def test_the_loop_streams_the_update_unless_something_needs_the_whole_batch(extra, reason):
    why = stream_blocker(load_config(None, extra))
    assert why == reason if reason is None else reason in why


def test_a_user_plugin_with_the_trait_is_not_streamed():
    """By trait, not by name: a registered advantage or reward that declares whole_batch waits."""
    ADVANTAGES.register("test_traits_whole", grouped=True, whole_batch=True)(ADVANTAGES.get("grpo").fn)
    REWARDS.register("test_traits_whole_reward", whole_batch=True)(REWARDS.get("exact").fn)
    try:
        assert "test_traits_whole" in stream_blocker(load_config(None, ["algo.advantage.name=test_traits_whole"]))
        why = stream_blocker(load_config(None, ["reward=[{name: test_traits_whole_reward}]"]))
        assert why == "reward 'test_traits_whole_reward' uses statistics of the whole round"
    finally:
        ADVANTAGES._entries.pop("test_traits_whole")
        REWARDS._entries.pop("test_traits_whole_reward")


def test_a_critic_advantage_sets_advantages_and_returns_once():
    b = make_batch([[1.0], [0.0]], comp_lens=[3, 2], prompt_lens=[1, 2])
    g = torch.Generator().manual_seed(0)
    b = replace(b, values=torch.randn(b.input_ids.shape, generator=g))
    assert b.returns is None  # storing the critic's values computes nothing else
    b = stages.advantage(b, ADVANTAGES.bind("gae", {"gamma": 0.9, "lam": 0.8, "whiten": False}))
    adv, ret = gae_advantages_and_returns(last_token_rewards(b.rewards, b.loss_mask), b.values, b.loss_mask,
                                          0.9, 0.8)
    assert torch.equal(b.advantages, adv) and torch.equal(b.returns, ret)
    assert torch.all(b.returns[b.loss_mask == 0] == 0) and bool((b.returns != 0).any())
    # a plain estimator leaves returns alone
    b.returns = None
    b = stages.advantage(b, ADVANTAGES.bind("grpo"))
    assert b.returns is None and b.advantages.dtype == torch.float32


def test_a_sampler_that_merges_repeats_is_not_streamed():
    """CERO gives a prompt drawn k times one group of k x n rollouts, which may span Ray jobs."""
    from upslope.data.samplers import CeroSampler

    cfg = load_config(None, ["data.sampler.name=cero"])
    assert stream_blocker(cfg, CeroSampler(8)) == "sampler 'cero' makes a prompt's repeated draws one group"
    assert stream_blocker(cfg, CeroSampler(8, merge_groups=False)) is None
