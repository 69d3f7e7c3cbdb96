"""Progress-SQL (Zhang et al. 2026, *Improving Reinforcement Learning for Text-to-SQL via Progressive Rewards*):
multi-turn Text-to-SQL refinement against a real database.

Each model turn is a query; it runs on the example's database, read-only (upslope.rewards.sql). A right
result ends the episode; otherwise the result (its first rows) or the error comes back as the next user
turn, optionally with the clauses that differ from the gold query (the paper's oracle-guided diagnosis,
reduced to clause names), and the model writes a corrected query, up to `attempts` queries. The rewards,
as reward parts: `correct` (the last query's result is the gold result), `exec` (the last query ran without
error: recovering from an invalid query pays), `progress` (the alignment of the last query minus that of the
first, alignment = the mean of clause-level structural and lexical agreement with the gold query) and `early`
(1 - (t - 1) / attempts when the query at turn t is right, 0 when none is: earlier correctness pays more).
Each turn returns the change of every part, so the parts a trajectory earned are those of its last query,
wherever the rollout stopped it. The feedback uses the gold query, so it is guidance (`hint`): evaluation
scores the first query, unaided; recipes set agent.hint_decay to 1, since `early` already prices late
answers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from upslope.agents.env import Environment, Message, StepResult
from upslope.bounds import Positive, PositiveCount
from upslope.errors import DataError
from upslope.registry import ENVIRONMENTS
from upslope.rewards.sql import QueryResult, ReadOnlyDatabase, alignment, differing_clauses, extract_sql, same_result

if TYPE_CHECKING:
    from upslope.data.types import Example


@ENVIRONMENTS.register("progress_sql")
class ProgressSQL(Environment):
    """Progress-SQL: queries refined over turns against a read-only SQLite database (example meta: `db`, the
    file; `ordered`, whether order counts; the answer is the gold query), with Progress-SQL's rewards.

    attempts: most queries per episode (the first right one ends it)
    timeout_s: wall-clock limit of one query
    max_rows: a result with more rows is an error
    show_rows: rows of a wrong result shown to the model
    diagnose: name the clauses (WHERE, ORDER BY, ...) that differ from the gold query in the feedback
    """

    reward_names = ("correct", "exec", "progress", "early")

    def __init__(self, *, attempts: PositiveCount = 3, timeout_s: Positive = 1.0, max_rows: PositiveCount = 1000,
                 show_rows: PositiveCount = 5, diagnose: bool = True):
        self.attempts, self.timeout_s, self.max_rows = attempts, timeout_s, max_rows
        self.show_rows, self.diagnose = show_rows, diagnose

    def reset(self, example: "Example") -> list[Message]:
        """Open the example's database read-only for this episode and run the gold query once."""
        self.example, self.turn, self.first = example, 0, None
        self.earned = dict.fromkeys(self.reward_names, 0.0)
        if "db" not in example.meta:
            raise DataError(f"example {example.id}: progress_sql needs meta field 'db' (the SQLite file)")
        self.db = ReadOnlyDatabase(example.meta["db"], timeout_s=self.timeout_s, max_rows=self.max_rows)
        self.gold = self.db.run(str(example.answer))
        if not self.gold.ok:
            raise DataError(f"example {example.id}: the gold query fails ({self.gold.error}): {example.answer}")
        return example.messages()

    def step(self, history: list[Message], model_turn: str) -> StepResult:
        assert self.example is not None
        self.turn += 1
        query = extract_sql(self.example.prefill + model_turn)
        got = self.db.run(query) if query else QueryResult(error="no query")
        right = same_result(got, self.gold, bool(self.example.meta.get("ordered")))
        align = alignment(query, str(self.example.answer))
        self.first = align if self.first is None else self.first
        now = {"correct": float(right), "exec": float(got.ok), "progress": align - self.first,
               "early": 1 - (self.turn - 1) / self.attempts if right else 0.0}
        delta = {k: now[k] - self.earned[k] for k in now}
        self.earned = now
        if right or self.turn >= self.attempts:
            self.db.close()
            return StepResult(done=True, reward_parts=delta)
        return StepResult([{"role": "user", "content": self.feedback(query, got)}], done=False, reward_parts=delta,
                          hint=True, prefill=self.example.prefill)

    def feedback(self, query: str, got: QueryResult) -> str:
        """What the model is told about a wrong query: its result's first rows or its error, and the clauses
        that differ from the gold query when `diagnose`."""
        if got.ok:
            shown = ", ".join(map(str, got.rows[:self.show_rows])) + (" ..." if len(got.rows) > self.show_rows else "")
            said = f"The query returned {len(got.rows)} row(s): {shown or 'nothing'}. That is not the right result."
        else:
            said = f"The query failed: {got.error}."
        if self.diagnose and query:
            wrong = differing_clauses(query, str(self.example.answer)) if self.example else []
            said += f" Check the {', '.join(c.upper() for c in wrong)} clause(s)." if wrong else ""
        return said + " Write a corrected query."
