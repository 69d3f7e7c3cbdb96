"""Progress-SQL: the read-only database against hostile queries (DROP TABLE, ATTACH, INSERT, PRAGMA writes, a
runaway recursive CTE), execution-based correctness, the alignment and the four rewards of an episode computed
by hand, the seeded task and its held-out split, and a real multi-turn rollout (tiny model, HF engine)."""
from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import pytest

from upslope.agents.sql import ProgressSQL
from upslope.config import load_config
from upslope.data import load_examples
from upslope.data.sql import database, sql
from upslope.data.types import Example
from upslope.rewards.sql import (QueryResult, ReadOnlyDatabase, alignment, clause_profile, differing_clauses,
                                 extract_sql, same_result, sql_execution)
from upslope.engine import SamplingParams
from upslope.rollout.multi_turn import AgentRun, multi_turn

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "progress_sql.yaml"
GOLD = "SELECT name FROM employees WHERE city = 'Paris'"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def counts(path: Path) -> tuple[int, int]:
    con = sqlite3.connect(path)
    out = tuple(con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("employees", "products"))
    con.close()
    return out


HOSTILE = [
    "DROP TABLE employees",
    "DELETE FROM employees",
    "INSERT INTO employees VALUES (99, 'Mallory', 'Sales', 'Paris', 30, 1)",
    "UPDATE employees SET salary = 0",
    "CREATE TABLE t (x)",
    "ATTACH DATABASE '{other}' AS other",
    "PRAGMA journal_mode = WAL",
    "PRAGMA user_version = 7",
    "PRAGMA writable_schema = ON",
    "BEGIN IMMEDIATE",
    "VACUUM",
    "SELECT 1; DROP TABLE employees",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_are_refused_and_change_nothing(query, tmp_path):
    db = database(0)
    before, rows = digest(db), counts(db)
    con = ReadOnlyDatabase(db)
    got = con.run(query.format(other=tmp_path / "other.sqlite"))
    assert not got.ok and got.error, query
    assert con.run("SELECT COUNT(*) FROM employees").rows == ((rows[0],),)  # the connection still reads
    con.close()
    assert digest(db) == before and counts(db) == rows
    assert not (tmp_path / "other.sqlite").exists()  # ATTACH never created the other file


def test_the_file_is_opened_read_only_even_without_the_authorizer():
    """The second wall: mode=ro alone refuses a write."""
    db = database(0)
    con = ReadOnlyDatabase(db)
    con.con.set_authorizer(None)
    got = con.run("DELETE FROM employees")
    assert "readonly" in got.error.replace("-", "").replace(" ", "").lower()
    con.close()


def test_a_runaway_recursive_cte_stops_at_the_time_limit():
    con = ReadOnlyDatabase(database(0), timeout_s=0.3)
    t = time.monotonic()
    got = con.run("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r")
    assert time.monotonic() - t < 5.0
    assert got.error == "the query ran past its time limit (0.3 s)"
    # a bounded recursive CTE is an ordinary read
    assert con.run("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 5) "
                   "SELECT SUM(x) FROM r").rows == ((15,),)
    # huge values and too many rows are errors, not memory
    assert not con.run("SELECT zeroblob(100000000)").ok
    assert con.run("SELECT a.id FROM employees a, employees b, employees c").error == \
        "the query returned more than 1000 rows"
    con.close()


def test_results_compare_as_multisets_unless_the_question_asks_for_an_order():
    a = QueryResult((("Ann",), ("Bob",), ("Bob",)))
    assert same_result(QueryResult((("Bob",), ("Ann",), ("Bob",))), a, ordered=False)
    assert not same_result(QueryResult((("Bob",), ("Ann",), ("Bob",))), a, ordered=True)
    assert not same_result(QueryResult((("Ann",), ("Bob",))), a, ordered=False)  # a duplicate counts
    assert same_result(QueryResult(((1 / 3,),)), QueryResult(((0.3333333,),)), ordered=False)  # 6 decimals
    assert not same_result(QueryResult(error="x"), QueryResult(error="x"), ordered=False)


def test_extract_sql():
    assert extract_sql("SELECT name FROM t WHERE x = 1;\nThis query lists ...") == "SELECT name FROM t WHERE x = 1"
    assert extract_sql("```sql\nSELECT a FROM t\n```\nmore") == "SELECT a FROM t"
    assert extract_sql("SELECT a\nFROM t\n\nExplanation") == "SELECT a\nFROM t"


def test_alignment_by_hand():
    q = "SELECT name FROM employees WHERE city = 'Rome'"
    assert clause_profile(q) == {"select": "name", "from": "employees", "where": "city = ' rome '"}
    # structural: select and from match, where differs: 2/3; lexical: tokens select name from employees where
    # city = ' and rome | paris: 8 shared of 10
    assert alignment(q, GOLD) == pytest.approx((2 / 3 + 8 / 10) / 2)
    assert alignment(GOLD, GOLD) == 1.0
    assert differing_clauses(q + " ORDER BY age", GOLD) == ["where", "order by"]
    assert differing_clauses('select  NAME from employees where city="Paris"', GOLD) == []


def paris_example() -> Example:
    return Example(prompt="Who lives in Paris?", answer=GOLD, prefill="SELECT",
                   meta={"db": str(database(0)), "ordered": False, "prefill": "SELECT"}, id="paris")


def test_an_episode_earns_the_four_rewards_by_hand():
    """An error, then a wrong result, then the gold result at turn 3 of 3: correct 1, exec 1 (recovered),
    progress = alignment(last) - alignment(first), early = 1 - 2/3. The parts each turn returns sum to
    those of the last query."""
    env = ProgressSQL(attempts=3)
    ex = paris_example()
    env.reset(ex)
    first = " nme FROM employees WHERE city = 'Paris'"
    r1 = env.step([], first)
    assert not r1.done and r1.hint and r1.prefill == "SELECT"
    assert r1.messages[0]["content"].startswith("The query failed: no such column: nme.")
    assert "Check the SELECT clause(s)." in r1.messages[0]["content"]
    r2 = env.step([], " name FROM employees WHERE city = 'Rome'")
    assert "row(s)" in r2.messages[0]["content"] and "Check the WHERE clause(s)" in r2.messages[0]["content"]
    r3 = env.step([], " name FROM employees WHERE city = 'Paris';")
    assert r3.done and not r3.messages
    total = {k: r1.reward_parts[k] + r2.reward_parts[k] + r3.reward_parts[k] for k in env.reward_names}
    a1 = alignment("SELECT" + first, GOLD)
    assert a1 == pytest.approx((2 / 3 + 8 / 10) / 2)  # select differs; tokens: nme against name, 8 shared of 10
    assert total == pytest.approx({"correct": 1.0, "exec": 1.0, "progress": 1.0 - a1, "early": 1 - 2 / 3})
    assert r1.reward_parts == {"correct": 0.0, "exec": 0.0, "progress": 0.0, "early": 0.0}
    assert r2.reward_parts["exec"] == 1.0  # the second query runs: the running parts say so at once


def test_a_right_first_query_ends_the_episode_with_full_early_credit():
    env = ProgressSQL(attempts=3)
    env.reset(paris_example())
    r = env.step([], " name FROM employees WHERE city = 'Paris'")
    assert r.done and r.reward_parts == {"correct": 1.0, "exec": 1.0, "progress": 0.0, "early": 1.0}


def test_the_single_turn_reward():
    ex = paris_example()
    assert sql_execution(" name FROM employees WHERE city = 'Paris'", ex.answer, ex.meta) == 1.0
    assert sql_execution(" name FROM employees WHERE city = 'Rome'", ex.answer, ex.meta) == 0.0
    assert sql_execution("; DROP TABLE employees", ex.answer, ex.meta) == 0.0


def test_the_task_is_seeded_and_its_held_out_questions_are_never_trained_on():
    train, test = sql(split="train"), sql(split="test")
    assert [e.prompt for e in sql(split="test")] == [e.prompt for e in test]
    assert not {e.meta["question"] for e in train} & {e.meta["question"] for e in test}
    assert (len(train), len(test)) == (79, 83)  # at most 20 instances of each of 14 templates, half held out
    by_template = [e.meta["template"] for e in train + test]
    assert max(by_template.count(t) for t in set(by_template)) <= 20 and len(set(by_template)) == 14
    con = ReadOnlyDatabase(test[0].meta["db"])
    assert all(con.run(e.answer).rows for e in train + test)  # no empty gold result
    con.close()
    assert any(e.meta["ordered"] for e in train) and "CREATE TABLE" in test[0].prompt
    assert digest(database(1)) != digest(database(0))


def test_the_recipe_rolls_out_queries_and_masks_the_feedback(tokenizer, hf_engine, tmp_path):
    """Two trajectories of the recipe on the tiny random model: every query ran through the environment, the
    feedback turns are environment tokens (loss mask 0) and every reward part is reported."""
    cfg = load_config(RECIPE, [f"run_dir={tmp_path}"])
    run = AgentRun.from_config(cfg, tokenizer)
    examples = load_examples(cfg.data, "test")[:1]
    tr = run.start(examples[0], 0)
    assert len(tr.prompt) <= cfg.rollout.max_prompt_tokens
    batch = multi_turn(hf_engine, [], examples, SamplingParams(n=2, max_new_tokens=cfg.rollout.max_new_tokens,
                                                               seed=0, stop_token_ids=[2]), 2, run=run)
    assert batch.size == 2
    for i, m in enumerate(batch.meta):
        assert set(m["reward_parts"]) == {"correct", "exec", "progress", "early"}
        users = [x["content"] for x in m["messages"] if x["role"] == "user"][1:]
        assert all(u.endswith("Write a corrected query.") for u in users)
        assert m["metrics"]["agent/turns"] == len(users) + 1 or m["metrics"]["agent/env_reply_cut"] == 1.0
        p = int(batch.prompt_lens[i])  # each model turn's span (CTC-GRPO's turn credit) is trained tokens only
        assert sum(b - a for a, b in m["turn_spans"]) == int(batch.loss_mask[i].sum())
        assert all(bool(batch.loss_mask[i, p + a:p + b].all()) for a, b in m["turn_spans"])
        assert len(m["turn_parts"]) == len(m["turn_spans"]) == m["metrics"]["agent/turns"]
        if users:  # the feedback is in the row as environment tokens
            assert m["metrics"]["agent/env_tokens"] > 0
            assert int(batch.loss_mask[i].sum()) == int(m["metrics"]["agent/model_tokens"])
