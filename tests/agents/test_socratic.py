"""SocraticPO's environment: the rule teacher's guidance and CATPO's critique by hand,
and a real two-turn rollout (tiny model, HF engine) where every wrong first answer gets that guidance and a
decayed reward."""
from __future__ import annotations

from pathlib import Path

import pytest

from upslope.rollout.multi_turn import AgentRun, multi_turn
from upslope.agents.socratic import arith_critique, arith_guidance
from upslope.config import load_config
from upslope.data import load_examples
from upslope.data.types import Example
from upslope.models import load_tokenizer
from upslope.engine import SamplingParams

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "socratic.yaml"


def test_arith_guidance_by_hand():
    ex = Example(prompt="37 + 45 =", answer=82, meta={"a": 37, "b": 45, "op": "+"})
    assert arith_guidance(ex, " 71\nmore") == ('"71" is not right. Start from the ones: the ones digits give '
                                              '7 + 5 = 12: write 2 and carry 1. 37 + 45 =')
    ex = Example(prompt="13 * 4 =", answer=52, meta={"a": 13, "b": 4, "op": "*"})
    assert arith_guidance(ex, "9").endswith("3 * 4 = 12. 13 * 4 =")
    assert "step by step" in arith_guidance(Example(prompt="q"), "x")


def test_arith_critique_by_hand(tokenizer):
    """CATPO's critique (the rule teacher as judge), 47 + 35 = 82: " 87" goes wrong at its 3rd token ("7"),
    " 82" is right, "The answer" is wrong from token 0."""
    ex = Example(prompt="47 + 35 =", answer=82, meta={"a": 47, "b": 35, "op": "+"})
    dec = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    fp, text = arith_critique(ex, enc(" 87") + [2], dec)
    assert fp == 2 and text.startswith('"87" is not right. Start from the ones: the ones digits give 7 + 5 = 12')
    assert arith_critique(ex, enc(" 82") + [2], dec) is None
    assert arith_critique(ex, enc("The answer"), dec)[0] == 0
    assert arith_critique(ex, enc(" 8") + [2], dec)[0] == 2  # stopped early: regrown from the stop token
    assert arith_critique(Example(prompt="q", answer=1), enc(" 2"), dec) is None  # no operands: no judgement


def test_the_recipe_budget_holds_both_turns_and_the_longest_guidance(smollm_path, tmp_path):
    """socratic.yaml's rollout.max_new_tokens fits a cut first turn, the teacher's longest guidance as the
    recipe's chat template renders it, and a second turn. Its first budget, 24 tokens, did not: every
    guidance was cut off, agent/turns stayed 1 and training was GRPO's (the reproduction caught it)."""
    cfg = load_config(RECIPE, [f"run_dir={tmp_path}"])
    run = AgentRun.from_config(cfg, load_tokenizer(smollm_path, cfg.model.chat_template))
    worst = Example(prompt="99 + 99 =", answer=198, meta={"a": 99, "b": 99, "op": "+"})
    guidance = arith_guidance(worst, "x" * 60)  # the teacher quotes at most 40 characters of the answer
    reply = run.continuation([{"role": "user", "content": guidance}], stop_id=None)  # a cut turn: whole closing
    turn = cfg.agent.max_turn_tokens
    assert turn + len(reply) + turn <= cfg.rollout.max_new_tokens, (len(reply), cfg.rollout.max_new_tokens)


@pytest.mark.slow  # ~25 s alone, 60 s under load: a real two-turn rollout
def test_socratic_rollout_guides_wrong_answers(smollm_path, hf_engine, tmp_path):
    cfg = load_config(RECIPE, [f"run_dir={tmp_path}"])
    tokenizer = load_tokenizer(smollm_path, cfg.model.chat_template)
    run = AgentRun.from_config(cfg, tokenizer)
    examples = load_examples(cfg.data, "test")[:2]
    batch = multi_turn(hf_engine, [], examples, SamplingParams(n=2, max_new_tokens=cfg.rollout.max_new_tokens,
                                                               seed=0, stop_token_ids=[2]), 2, run=run)
    assert batch.size == 4
    for m in batch.meta:
        users = [x["content"] for x in m["messages"] if x["role"] == "user"]
        hinted = m["metrics"]["agent/hints"] == 1.0
        assert hinted == (len(users) == 2)  # the random tiny model: a hint exactly after a wrong first answer
        assert m["metrics"]["agent/env_reply_cut"] == 0.0
        if hinted:  # the guidance is in the row the policy trains on, as environment tokens
            assert "is not right. Start from the ones" in users[1] and users[1].endswith(f"{m['a']} + {m['b']} =")
            assert "is not right. Start from the ones" in m["transcript"] and m["metrics"]["agent/env_tokens"] > 0
            assert m["metrics"]["agent/turns"] == 2.0
            assert m["reward_parts"]["correct"] in (0.0, 0.5)  # after one hint: decayed by hint_decay 0.5
