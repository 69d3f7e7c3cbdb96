"""The HumanEval task: loading, and every canonical solution through the sandboxed `code` reward."""
import gzip
import json
import os
from collections import Counter

import pytest
from sandbox_helpers import needs_bwrap

from upslope.data.humaneval import DEFAULT_PATH, load_humaneval
from upslope.errors import DataError
from upslope.registry import REWARDS, TASKS

needs_data = pytest.mark.skipif(not os.path.exists(DEFAULT_PATH), reason=f"HumanEval not found at {DEFAULT_PATH}")


@needs_data
def test_load_humaneval_records():
    examples = load_humaneval()
    assert len(examples) == 164 and len({e.id for e in examples}) == 164
    ex = examples[0]
    assert ex.id == "HumanEval/0" and ex.answer is None
    assert ex.meta["task_id"] == "HumanEval/0" and ex.meta["entry_point"] == "has_close_elements"
    assert set(ex.meta) == {"task_id", "entry_point", "code_prefix", "test", "canonical_solution"}
    (msg,) = ex.messages()
    assert msg["role"] == "user" and "def has_close_elements(numbers: List[float]" in msg["content"]
    assert '"""' in msg["content"]  # the docstring is part of the prompt
    assert len(load_humaneval(limit=5)) == 5
    assert len(load_humaneval(os.path.dirname(DEFAULT_PATH), limit=2)) == 2  # a directory works too
    entry = TASKS.get("humaneval")
    assert entry.traits.reward == "code"
    assert [e.id for e in TASKS.bind("humaneval", {"limit": 3})()] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_plain_jsonl_and_malformed_lines(tmp_path):
    row = {"task_id": "T/0", "prompt": "def f():\n", "entry_point": "f", "canonical_solution": "    return 1\n",
           "test": "def check(c):\n    assert c() == 1\n"}
    good = tmp_path / "h.jsonl"
    good.write_text(json.dumps(row) + "\n\n" + json.dumps({**row, "task_id": "T/1"}) + "\n")
    assert [e.id for e in load_humaneval(str(good))] == ["T/0", "T/1"]

    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(json.dumps(row) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl\.gz:2: invalid JSON"):
        load_humaneval(str(bad))
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps(row) + "\n" + json.dumps({"task_id": "T/2", "prompt": "x"}) + "\n")
    with pytest.raises(DataError, match=r"missing\.jsonl:2: missing .*entry_point"):
        load_humaneval(str(missing))
    with pytest.raises(DataError, match="not found"):
        load_humaneval(str(tmp_path / "nope.jsonl"))


def check_canonical_pass_and_broken_fail(examples: list) -> None:
    """Every canonical body passes its tests, as a bare body and fenced; a body returning None fails."""
    reward = REWARDS.bind("code", {"timeout_s": 20.0})
    n = len(examples)

    # the canonical body, as a base model would continue the prompt
    metas = [dict(e.meta) for e in examples]
    bodies = reward([e.meta["canonical_solution"] for e in examples], [None] * n, metas)
    failed = [(m["task_id"], m["sandbox_status"]) for m, r in zip(metas, bodies) if r != 1.0]
    assert failed == []

    # the whole function in a fenced block, as a chat model answers (a sample: same path)
    sample = examples[::8]
    metas = [dict(e.meta) for e in sample]
    fenced = [f"Here you go:\n```python\n{e.meta['code_prefix']}{e.meta['canonical_solution']}```\n" for e in sample]
    assert reward(fenced, [None] * len(sample), metas) == [1.0] * len(sample)

    # a body that returns None: every test suite must catch it
    metas = [dict(e.meta) for e in examples]
    results = reward(["    return None\n"] * n, [None] * n, metas)
    assert [m["task_id"] for m, r in zip(metas, results) if r != 0.0] == []
    assert Counter(m["sandbox_status"] for m in metas) == {"failed": n}


@needs_data
@needs_bwrap
def test_a_sample_of_canonical_solutions_pass_and_broken_ones_fail():
    check_canonical_pass_and_broken_fail(load_humaneval()[::12])


@pytest.mark.slow  # all 164 programs, three ways: 15 s
@needs_data
@needs_bwrap
def test_canonical_solutions_pass_and_broken_ones_fail():
    check_canonical_pass_and_broken_fail(load_humaneval())
