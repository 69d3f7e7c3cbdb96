"""Execution-based Text-to-SQL checking: a generated query runs on a read-only connection and its result set
is compared with the gold query's; the clause-level and lexical alignment of two queries (Progress-SQL's
progress reward, and the clauses its diagnosis names).

A generated query can never change the database or reach past it: the file is opened with the URI
`mode=ro`; an authorizer allows only reading (SELECT, reading columns, functions, recursive CTEs) and
denies everything else, ATTACH, writes, schema changes, PRAGMA and transactions included; no database can
be attached; a progress handler interrupts a query past its time limit (a runaway recursive CTE); strings
and blobs are capped in length, and at most `max_rows` rows are read.
"""
from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upslope.bounds import Positive, PositiveCount
from upslope.registry import REWARDS

READ_ONLY = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})
CLAUSES = ("select", "from", "where", "group by", "having", "order by", "limit")
_CLAUSE = re.compile(r"\b(select|from|where|group\s+by|having|order\s+by|limit)\b")
_CUT = re.compile(r";|```|\n\s*\n")


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in READ_ONLY else sqlite3.SQLITE_DENY


@dataclass(frozen=True)
class QueryResult:
    """The rows a query returned, or why it returned none (`error`)."""

    rows: tuple[tuple[Any, ...], ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class ReadOnlyDatabase:
    """A connection to a SQLite file that no query can change (see the module docstring).

    timeout_s: wall-clock limit of one query, fetching included
    max_rows: a result with more rows is an error
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 1.0, max_rows: int = 1000):
        self.timeout_s, self.max_rows, self.deadline = timeout_s, max_rows, 0.0
        self.con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
        self.con.set_authorizer(_authorize)
        self.con.set_progress_handler(lambda: int(time.monotonic() > self.deadline), 1000)
        self.con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)

    def run(self, query: str) -> QueryResult:
        """Run one statement; every failure (syntax, a denied action, the time limit) is a QueryResult error."""
        self.deadline = time.monotonic() + self.timeout_s
        try:
            rows = self.con.execute(query).fetchmany(self.max_rows + 1)
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            text = str(exc)
            if text == "interrupted":
                text = f"the query ran past its time limit ({self.timeout_s:g} s)"
            return QueryResult(error=text or type(exc).__name__)
        if len(rows) > self.max_rows:
            return QueryResult(error=f"the query returned more than {self.max_rows} rows")
        return QueryResult(tuple(tuple(r) for r in rows))

    def close(self) -> None:
        self.con.close()


def _value(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


def same_result(got: QueryResult, gold: QueryResult, ordered: bool) -> bool:
    """Whether a query's result is the gold result: the same rows (floats to 6 decimals), in the same order
    only when `ordered` (the question asks for one), else as multisets."""
    if not (got.ok and gold.ok):
        return False
    a = [tuple(map(_value, r)) for r in got.rows]
    b = [tuple(map(_value, r)) for r in gold.rows]
    return a == b if ordered else Counter(a) == Counter(b)


def extract_sql(text: str) -> str:
    """The query in a reply: a leading ```sql fence dropped, cut at the first `;`, closing fence or blank line."""
    text = re.sub(r"^\s*```(?:sql|sqlite)?\s*", "", text, flags=re.I)
    return _CUT.split(text, maxsplit=1)[0].strip()


def _normal(query: str) -> str:
    """Lower case, one quote style, and a single space between tokens (words, numbers, punctuation)."""
    return " ".join(re.findall(r"\w+|[^\w\s]", query.lower().replace('"', "'")))


def clause_profile(query: str) -> dict[str, str]:
    """Each clause of a query (select, from, where, group by, having, order by, limit) and its text, normalised
    (lower case, one quote style, tokens one space apart); a clause keyword repeated in a subquery extends
    the clause."""
    parts = _CLAUSE.split(_normal(query))
    out: dict[str, str] = {}
    for key, body in zip(parts[1::2], parts[2::2]):
        key = " ".join(key.split())
        out[key] = f"{out[key]} {key} {body.strip()}".strip() if key in out else body.strip()
    return out


def differing_clauses(query: str, gold: str) -> list[str]:
    """The clauses present in either query whose text differs, in SQL order."""
    a, b = clause_profile(query), clause_profile(gold)
    return [c for c in CLAUSES if (c in a or c in b) and a.get(c) != b.get(c)]


def alignment(query: str, gold: str) -> float:
    """Mean of the structural alignment (share of the clauses present in either query that match exactly) and
    the lexical alignment (Jaccard overlap of the token sets), in [0, 1]; 1 for the gold query itself."""
    a, b = clause_profile(query), clause_profile(gold)
    present = [c for c in CLAUSES if c in a or c in b]
    structural = sum(a.get(c) == b.get(c) for c in present) / len(present) if present else 0.0
    ta, tb = (set(_normal(q).split()) for q in (query, gold))
    lexical = len(ta & tb) / len(ta | tb) if ta | tb else 0.0
    return (structural + lexical) / 2


@REWARDS.register("sql_execution")
def sql_execution(completion: str, answer: Any, meta: dict, *, timeout_s: Positive = 1.0,
                  max_rows: PositiveCount = 1000) -> float:
    """1 when the reply's query (meta["prefill"] + the reply) returns the gold query's result on the example's
    database (meta["db"], read-only), else 0; order counts only where meta["ordered"].

    timeout_s: wall-clock limit of one query
    max_rows: a result with more rows counts as wrong
    """
    db = ReadOnlyDatabase(meta["db"], timeout_s=timeout_s, max_rows=max_rows)
    try:
        got = db.run(extract_sql(meta.get("prefill", "") + completion))
        return float(same_result(got, db.run(str(answer)), bool(meta.get("ordered"))))
    finally:
        db.close()
