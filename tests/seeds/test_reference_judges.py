"""ExpRL's rubric judge and Turing-RL's discriminative judge on a real local judge model (the tiny
random model, its reply steered by a prefill that holds the rubric, the grade or the pick): one rubric
per problem written from the hidden reference and put into every grading query, the picks of both
orders averaged, and one clear failure for an example without its reference."""
from __future__ import annotations

import math

import pytest

from upslope.config import RewardSpec
from upslope.errors import DataError
from upslope.rewards import build_reward_fns, score
from upslope.rewards.judge import judge_backend
from upslope.rewards.reference_judge import hidden_reference, parse_choice

METAS = [{"prompt": "Tom has 6 apples and buys 6. How many?", "solution": "6 + 6 = 12 #### 12"},
         {"prompt": "Tom has 6 apples and buys 6. How many?", "solution": "6 + 6 = 12 #### 12"},
         {"prompt": "What is 3 * 4?", "solution": "3 * 4 = 12 #### 12"}]


def test_rubric_judge_writes_one_rubric_per_problem_and_grades_against_it(tiny_model_path):
    opts = {"model": tiny_model_path, "rubric_prefill": "Rubric: reach 12.\n", "prefill": "Score: 6\n",
            "rubric_tokens": 3, "max_new_tokens": 2}
    [fn] = build_reward_fns([RewardSpec(name="rubric_judge", options=opts)])
    assert fn.fn(["12", "11", "12"], ["12"] * 3, METAS) == [0.6, 0.6, 0.6]
    judge = judge_backend(tiny_model_path, None, "default", "OPENAI_API_KEY", "auto", 2, 16, 60.0)
    rubric_queries = [q for (tag, q) in judge.cache if tag == (None, "Rubric: reach 12.\n", 3)]
    grade_queries = [q for (tag, q) in judge.cache if tag == (None, "Score: 6\n", None)]
    assert len(rubric_queries) == 2  # two problems: the repeated one's rubric is written once
    assert all("6 + 6 = 12 #### 12" in q or "3 * 4 = 12 #### 12" in q for q in rubric_queries)
    assert len(grade_queries) == 3 and all("Rubric: reach 12." in q for q in grade_queries)
    assert not any("#### 12" in q for q in grade_queries)  # the reference itself stays hidden from the grading


def test_turing_judge_scores_how_often_the_generated_reply_is_taken_for_the_real_one(tiny_model_path):
    """A judge that always answers A: with the generated reply first it is fooled (1), second not (0); asked
    both orders the picks average to 0.5 (a position-biased judge gives no signal)."""
    def run(**o):
        spec = RewardSpec(name="turing_judge", options={"model": tiny_model_path, "prefill": "Answer: A\n",
                                                        "max_new_tokens": 1, "reference_field": "solution", **o})
        [fn] = build_reward_fns([spec])
        return fn.fn(["12", "I think 13"], ["12", "12"], METAS[:2])

    assert run(order="generated_first") == [1.0, 1.0]
    assert run(order="real_first") == [0.0, 0.0]
    assert run() == [0.5, 0.5]


def test_a_judge_reply_without_a_pick_fails_the_sample(tiny_model_path):
    """The prefill names no letter and the judge adds one token (a newline, for the tiny model): a reply
    without A or B leaves its order out; with none left the sample fails (fallback, counted)."""
    spec = RewardSpec(name="turing_judge", options={"model": tiny_model_path, "prefill": "Answer: neither\n",
                                                    "max_new_tokens": 1, "reference_field": "solution"})
    [fn] = build_reward_fns([spec])
    judge = judge_backend(tiny_model_path, None, "default", "OPENAI_API_KEY", "auto", 1, 16, 60.0)
    result = score([fn], ["12"], ["12"], METAS[:1], fallback=-1.0)
    replies = [r for (tag, _), r in judge.cache.items() if tag == (None, "Answer: neither\n", None)]
    assert len(replies) == 2 and [parse_choice(r) for r in replies] == [None, None]  # the tiny model wrote "\n"
    assert result.failures == {"turing_judge": 1} and result.components["turing_judge"] == [-1.0]


def test_parse_choice_and_hidden_reference():
    assert parse_choice("Answer: B") == "B" and parse_choice("A, or rather B.") == "B"
    assert parse_choice("Answer: neither") is None and parse_choice("ABBA") is None and parse_choice(None) is None
    assert hidden_reference({"solution": "x"}, 3, "solution") == "x" and hidden_reference({}, 3, "answer") == "3"
    with pytest.raises(DataError, match="no reference in field 'solution'"):
        hidden_reference({}, 3, "solution")


def test_an_example_without_its_reference_fails_with_the_field_named(tiny_model_path):
    spec = RewardSpec(name="rubric_judge", options={"model": tiny_model_path, "max_new_tokens": 1,
                                                    "rubric_tokens": 1})
    result = score(build_reward_fns([spec]), ["12", "13"], ["12", "12"], [{"prompt": "q"}] * 2, fallback=0.0)
    assert result.failures == {"rubric_judge": 2}
    assert "no reference in field 'solution'" in result.errors["rubric_judge"]
    assert not math.isnan(result.components["rubric_judge"][0])
