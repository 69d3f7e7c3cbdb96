"""The `sql` task: seeded Text-to-SQL questions over a small SQLite database built once and cached.

Two tables (employees, products) filled from a seeded generator; questions from templates, each with
its gold query. Every (template, values) instance is enumerated, shuffled by the seed and split into a
training and a held-out part, so no held-out question is asked in training. Instances whose gold result
is empty or only NULL are left out (any query that selects nothing, or averages nothing, would match it).
"""
from __future__ import annotations

import hashlib
import os
import random
import sqlite3
from pathlib import Path
from typing import Any

from upslope.bounds import Fraction, PositiveCount
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.registry import TASKS

SCHEMA = {
    "employees": "CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, department TEXT, city TEXT, "
                 "age INTEGER, salary INTEGER)",
    "products": "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price INTEGER, "
                "stock INTEGER)",
}
NAMES = ["Alice", "Bruno", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Karin", "Liam",
         "Maya", "Nils", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wim", "Xenia", "Yusuf",
         "Zoe", "Anton", "Bea", "Carl", "Dana"]
DEPARTMENTS = ["Sales", "Engineering", "Marketing", "Finance"]
CITIES = ["Paris", "London", "Berlin", "Madrid", "Rome"]
PRODUCTS = ["lamp", "chair", "desk", "mug", "pen", "notebook", "kettle", "towel", "pillow", "clock", "vase",
            "basket", "mirror", "candle", "bottle", "scarf", "hat", "glove", "jacket", "boots"]
CATEGORIES = ["home", "office", "kitchen", "clothing"]
AGES, SALARIES, PRICES = range(23, 63, 2), range(35000, 120000, 5000), range(5, 101, 5)
# (question, gold query, ordered): the question fixes the order only where it asks for one
TEMPLATES: list[tuple[str, str, str, bool]] = [
    ("employees", "What are the names of the employees in the {d} department?",
     "SELECT name FROM employees WHERE department = '{d}'", False),
    ("employees", "How many employees work in the {d} department?",
     "SELECT COUNT(*) FROM employees WHERE department = '{d}'", False),
    ("employees", "What are the names of the employees who live in {c}?",
     "SELECT name FROM employees WHERE city = '{c}'", False),
    ("employees", "What is the average age of the employees who live in {c}?",
     "SELECT AVG(age) FROM employees WHERE city = '{c}'", False),
    ("employees", "List the names of the employees who live in {c}, from the youngest to the oldest.",
     "SELECT name FROM employees WHERE city = '{c}' ORDER BY age", True),
    ("employees", "How many employees are older than {a}?", "SELECT COUNT(*) FROM employees WHERE age > {a}", False),
    ("employees", "What are the names of the employees younger than {a}?",
     "SELECT name FROM employees WHERE age < {a}", False),
    ("employees", "What are the names of the employees with a salary above {s}?",
     "SELECT name FROM employees WHERE salary > {s}", False),
    ("employees", "What are the names of the employees in the {d} department who live in {c}?",
     "SELECT name FROM employees WHERE department = '{d}' AND city = '{c}'", False),
    ("employees", "How many employees in the {d} department are older than {a}?",
     "SELECT COUNT(*) FROM employees WHERE department = '{d}' AND age > {a}", False),
    ("products", "What are the names of the products in the {g} category?",
     "SELECT name FROM products WHERE category = '{g}'", False),
    ("products", "How many products cost less than {p}?", "SELECT COUNT(*) FROM products WHERE price < {p}", False),
    ("products", "What is the highest price of the products in the {g} category?",
     "SELECT MAX(price) FROM products WHERE category = '{g}'", False),
    ("products", "What are the names of the products in the {g} category that cost less than {p}?",
     "SELECT name FROM products WHERE category = '{g}' AND price < {p}", False),
]
VALUES = {"d": DEPARTMENTS, "c": CITIES, "a": list(AGES), "s": list(SALARIES), "g": CATEGORIES, "p": list(PRICES)}
# one worked example on a table no question uses: the embedded 135M model answers with `SELECT *` without it
EXAMPLE = ("CREATE TABLE pets (id INTEGER PRIMARY KEY, name TEXT, species TEXT, age INTEGER)\n"
           "Question: What are the names of the pets older than 3?\nSQL: SELECT name FROM pets WHERE age > 3;\n\n")
_VERSION = "1"  # bump when the generator changes: the cached file is keyed by it


def rows(seed: int) -> dict[str, list[tuple[Any, ...]]]:
    """The seeded contents of each table (ages distinct, so an order by age has no ties)."""
    rng = random.Random(seed)
    ages = rng.sample(range(22, 65), len(NAMES))
    employees = [(i + 1, n, rng.choice(DEPARTMENTS), rng.choice(CITIES), ages[i], rng.randrange(30000, 121000, 1000))
                 for i, n in enumerate(NAMES)]
    products = [(i + 1, n, rng.choice(CATEGORIES), rng.randrange(3, 101), rng.randrange(0, 200))
                for i, n in enumerate(PRODUCTS)]
    return {"employees": employees, "products": products}


def database(seed: int = 0, cache: str | None = None) -> Path:
    """The database file for `seed`, built once under the cache (UPSLOPE_CACHE, else ~/.cache/upslope) and
    reused; written to a temporary name and renamed, so a reader never sees half a file."""
    from upslope.cache import cache_root

    key = hashlib.sha256(f"{_VERSION}:{seed}".encode()).hexdigest()[:12]
    path = cache_root(cache) / "sql" / f"sql-{key}.sqlite"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    con = sqlite3.connect(tmp)
    contents = rows(seed)
    with con:
        for table, ddl in SCHEMA.items():
            con.execute(ddl)
            data = contents[table]
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(data[0]))})", data)
    con.close()
    os.replace(tmp, path)
    return path


def instances(seed: int, per_template: int) -> list[tuple[int, dict[str, Any]]]:
    """At most `per_template` (template index, values) of each template, drawn by the seed, then shuffled
    (so two-value templates, with many more combinations, do not crowd out the others)."""
    rng = random.Random(seed)
    out = []
    for t, (_, question, _, _) in enumerate(TEMPLATES):
        keys = [k for k in VALUES if "{" + k + "}" in question]
        combos: list[dict[str, Any]] = [{}]
        for k in keys:
            combos = [{**c, k: v} for c in combos for v in VALUES[k]]
        out += [(t, c) for c in rng.sample(combos, min(per_template, len(combos)))]
    rng.shuffle(out)
    return out


@TASKS.register("sql", reward="sql_execution", max_new_tokens=48, splits=("train", "test"))
def sql(*, split: str = "train", seed: int = 0, test_fraction: Fraction = 0.5, per_template: PositiveCount = 20,
        prompt: str = EXAMPLE + "{schema}\nQuestion: {question}\nSQL:", prefill: str = "SELECT") -> list[Example]:
    """Text-to-SQL over a small seeded SQLite database: each example's answer is its gold query, its meta
    the database file (`db`), whether the result's order counts (`ordered`) and the question's table.

    split: "train" or "test" (the held-out questions: no question text is in both)
    seed: seeds the database's contents and the split
    test_fraction: share of the question instances held out
    per_template: most instances of one template (drawn by the seed)
    prompt: format string with {schema} (the CREATE statement of the question's table) and {question}; the
    default opens with one worked example on a table of its own (pets)
    prefill: text the reply starts with (e.g. "SELECT"; empty: none); the query is prefill + the reply
    """
    if split not in ("train", "test"):
        raise DataError(f"data.split={split!r}: task 'sql' has only the splits train, test")
    db = database(seed)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    items = instances(seed, per_template)
    cut = round(len(items) * test_fraction)
    out = []
    for i, (t, values) in enumerate(items[:cut] if split == "test" else items[cut:]):
        table, question, gold, ordered = TEMPLATES[t]
        gold = gold.format(**values)
        if all(v is None for row in con.execute(gold).fetchall() for v in row):  # no rows, or only NULL
            continue
        text = question.format(**values)
        out.append(Example(prompt=prompt.format(schema=SCHEMA[table], question=text), answer=gold,
                           meta={"db": str(db), "ordered": ordered, "table": table, "question": text,
                                 "template": t, "prefill": prefill}, id=f"sql-{split}-{i}", prefill=prefill))
    con.close()
    return out
