"""The process reward's step scores as token rewards (placement: token) on the real tokenizer: the
token where each step ends, the rest of the reward on the last trained token, the advantages and
returns of gae and reinforce_pp at every token of a hand-computed case, and the one-line config
error for an estimator or combiner that cannot take token rewards."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_helpers import score_and_check

from upslope.batch import build_batch
from upslope.cli import main
from upslope.config import RewardSpec, load_config
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, REWARD_COMBINERS
from upslope.rewards import build_reward_fns
from upslope.rewards.placement import PlacedReward, char_end_tokens
from upslope.rewards.process import step_spans
from upslope.train import stages
from upslope.train.trainers.rl import check_config

PROCESS = {"step_reward": "format", "step_options": {"pattern": "ok"}, "prefix": False, "placement": "token"}


def scored(tokenizer, texts, specs, metas=None):
    """A batch of `texts` after the prompt [1, 2], each ending with the end token, through the reward stage."""
    comps = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    metas = metas or [{} for _ in texts]
    batch = build_batch([[1, 2]] * len(texts), comps, [[0.0] * len(c) for c in comps], list(range(len(texts))),
                        [False] * len(texts), tokenizer.pad_token_id,
                        meta=[{"answer": None, "completion": t, **m} for t, m in zip(texts, metas)])
    return score_and_check(batch, build_reward_fns(specs), REWARD_COMBINERS.bind("weighted_sum"), 0.0,
                         tokenizer=tokenizer)


def test_step_ends_and_their_tokens_by_hand(tokenizer):
    """'ok\\nbad\\nok' is the tokens ok | \\n | bad | \\n | ok: the steps end at characters 3, 7, 9, in tokens 1, 3, 4."""
    text = "ok\nbad\nok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["ok", "\n", "bad", "\n", "ok"]
    assert [e for _, e in step_spans(text, "\n")] == [3, 7, 9]
    assert char_end_tokens(tokenizer, ids, text, [3, 7, 9]) == [1, 3, 4]
    assert step_spans("a\n\nb", "\n") == [(0, 2), (3, 4)]  # the blank step is dropped, the offsets are the text's
    # a delimiter ending inside a token: ', ' ends at character 3, reached in the token ' b'
    ids = tokenizer("a, b", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["a", ",", " b"]
    assert char_end_tokens(tokenizer, ids, "a, b", [3]) == [2]
    assert char_end_tokens(tokenizer, ids, "not the ids' text", [3]) is None


def test_process_reward_returns_its_step_scores_placed():
    [fn] = build_reward_fns([RewardSpec(name="process", options=PROCESS)])
    got = fn.fn(["ok\nbad\nok"], [None], [{}])
    assert got == [PlacedReward(((3, 1.0), (7, 0.0), (9, 1.0)))] and float(got[0]) == 2.0
    assert fn.places_tokens and not build_reward_fns([RewardSpec(name="process", options={"step_reward": "format"})])[
        0].places_tokens


def test_token_rewards_advantages_and_returns_by_hand(tokenizer):
    """Prompt [1, 2] (positions 0-1), then ok \\n bad \\n ok <end> (positions 2-7). Rewards: process
    (weight 0.5, does the step contain 'ok': 1, 0, 1 at positions 3, 5, 6) and format 'bad' (weight 1,
    a sequence reward: 1 on the last trained token, 7). Combined: 0.5 * 2 + 1 = 2."""
    specs = [RewardSpec(name="process", weight=0.5, options=PROCESS),
             RewardSpec(name="format", options={"pattern": "bad"})]
    batch, metrics = scored(tokenizer, ["ok\nbad\nok"], specs)
    assert batch.rewards.tolist() == [2.0] and batch.reward_components["process"].tolist() == [2.0]
    assert batch.token_rewards[0].tolist() == [0, 0, 0, 0.5, 0, 0, 0.5, 1.0]
    assert metrics["token_rewards/unplaced"] == 0.0

    # REINFORCE++, gamma 0.5: reward-to-go from position 7 back: 1, 0.5 + 0.5 * 1 = 1, 0.5, 0.25,
    # 0.5 + 0.125 = 0.625, 0.3125; then whitened over the 6 trained tokens (population std)
    ret = torch.tensor([0.3125, 0.625, 0.25, 0.5, 1.0, 1.0], dtype=torch.float64)
    want = (ret - ret.mean()) / (ret.var(unbiased=False).sqrt() + 1e-6)
    adv = stages.advantage(batch, ADVANTAGES.bind("reinforce_pp", {"gamma": 0.5})).advantages
    assert adv[0, :2].tolist() == [0, 0]
    assert adv[0, 2:].tolist() == pytest.approx(want.tolist(), abs=1e-6)

    # GAE, gamma 1, lambda 0.5, values 0.5 on the trained tokens, V = 0 after the last:
    # deltas r + V' - V from position 7 back: 0.5, 0.5, 0, 0, 0.5, 0;
    # A = delta + 0.5 A': 0.5, 0.75, 0.375, 0.1875, 0.59375, 0.296875; returns = A + 0.5
    values = batch.loss_mask * 0.5
    out = stages.advantage(replace(batch, values=values),
                           ADVANTAGES.bind("gae", {"gamma": 1.0, "lam": 0.5, "whiten": False}))
    assert out.advantages[0].tolist() == pytest.approx([0, 0, 0.296875, 0.59375, 0.1875, 0.375, 0.75, 0.5])
    assert out.returns[0].tolist() == pytest.approx([0, 0, 0.796875, 1.09375, 0.6875, 0.875, 1.25, 1.0])

    # the same rewards as a sequence reward: everything on the last token, so the undiscounted
    # return is the same 2 at the first token, but the steps no longer get credit of their own
    seq = [RewardSpec(name="process", weight=0.5, options={**PROCESS, "placement": "sequence", "aggregate": "mean"}),
           specs[1]]
    plain, _ = scored(tokenizer, ["ok\nbad\nok"], seq)
    assert plain.token_rewards is None and plain.rewards.tolist() == pytest.approx([0.5 * 2 / 3 + 1])


def test_scaled_overridden_and_unplaceable_samples(tokenizer):
    """reward_scale scales the placed parts too; an overridden reward, and a text that is not its ids'
    decoding, keep the whole reward on the last trained token (the latter counted)."""
    texts = ["ok\nok", "ok\nok", "ok\nok"]
    comps = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    batch = build_batch([[1]] * 3, comps, [[0.0] * len(c) for c in comps], [0, 1, 2], [False] * 3,
                        tokenizer.pad_token_id, meta=[{"answer": None, "completion": t}
                                                      for t in ["ok\nok", "ok\nok", "ok\n ok"]])
    batch = replace(batch, reward_scale=torch.tensor([0.5, 1.0, 1.0]),
                    reward_override=torch.tensor([math.nan, -1.0, math.nan]))
    [fn] = build_reward_fns([RewardSpec(name="process", options=PROCESS)])
    out, metrics = score_and_check(batch, [fn], REWARD_COMBINERS.bind("weighted_sum"), 0.0, tokenizer=tokenizer)
    # tokens: <prompt> ok \n ok <end>; the third row's text has a space its ids do not
    assert out.rewards.tolist() == [1.0, -1.0, 2.0]
    assert out.token_rewards.tolist() == [[0, 0, 0.5, 0.5, 0], [0, 0, 0, 0, -1.0], [0, 0, 0, 0, 2.0]]
    assert metrics["token_rewards/unplaced"] == 2.0  # the third row's two steps


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(alphabet="ab \né", min_size=1, max_size=14), min_size=1, max_size=4),
       w=st.floats(-2, 2, allow_nan=False), v=st.floats(-2, 2, allow_nan=False))
def test_token_rewards_add_up_to_the_reward_on_trained_tokens(tokenizer, texts, w, v):
    """Whatever the steps, the row sums of the token rewards are the combined rewards, and no token
    reward lies off the trained tokens."""
    specs = [RewardSpec(name="process", weight=w, options={**PROCESS, "step_options": {"pattern": "a"}}),
             RewardSpec(name="format", weight=v, options={"pattern": "b"})]
    batch, _ = scored(tokenizer, texts, specs)
    assert batch.token_rewards.sum(1).tolist() == pytest.approx(batch.rewards.tolist(), abs=1e-5)
    assert bool((batch.token_rewards[batch.loss_mask == 0] == 0).all())


def test_token_rewards_trait_is_declared_at_registration():
    takes = {n for n in ADVANTAGES.names() if ADVANTAGES.get(n).traits.token_rewards}
    assert takes == {"balto", "gae", "reinforce_pp"}  # sr_ppo's critic reads the outcome in pass@k space only
    assert REWARD_COMBINERS.get("weighted_sum").traits.linear
    assert not REWARD_COMBINERS.get("group_normalized_sum").traits.linear


@pytest.mark.parametrize("override, message", [
    ("algo.advantage.name=grpo", "advantage 'grpo' reads only sequence rewards; use an advantage that takes "
                                 "token rewards (balto, gae, reinforce_pp)"),
    ("algo.advantage.name=sr_ppo", "advantage 'sr_ppo' reads only sequence rewards"),
    ("algo.reward_combiner.name=group_normalized_sum", "algo.reward_combiner 'group_normalized_sum' is not one"),
])
def test_an_estimator_or_combiner_without_token_rewards_refuses(override, message):
    reward = "reward=[{name: integer}, {name: process, options: {step_reward: format, placement: token}}]"
    with pytest.raises(ConfigError, match=r"reward\[1\] \(process\) puts rewards on tokens") as err:
        check_config(load_config(None, ["algo.advantage.name=reinforce_pp", override, reward]))
    assert message in str(err.value)
    check_config(load_config(None, ["algo.advantage.name=gae", reward]))  # a token-level estimator: fine
    check_config(load_config(None, [reward.replace("token", "sequence")]))  # grpo on the aggregate: fine


def test_the_refusal_is_one_line_from_the_command_line(capsys, tmp_path):
    code = main(["train", f"run_dir={tmp_path}", "log.progress=false",
                 "reward=[{name: process, options: {step_reward: format, placement: token}}]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "advantage 'grpo' reads only sequence rewards" in err, err
