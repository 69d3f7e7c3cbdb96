"""The `code` reward: program extraction, function tests, stdin/stdout cases, modes, statuses."""
from __future__ import annotations

import pytest
from sandbox_helpers import needs_bwrap

from upslope.errors import DataError
from upslope.registry import REWARDS
from upslope.rewards.code import extract_code, function_test, solution_program

ADD_META = {
    "code_prefix": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
}
ECHO_CASES = [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 5\n", "stdout": "10"}, {"stdin": "0 0", "stdout": "0"}]


def test_extract_code_fences():
    assert extract_code("just code()") == "just code()"
    text = "Here:\n```python\nfirst = 1\n```\nthen\n```py\nsecond = 2\n```\nbye"
    assert extract_code(text) == "second = 2\n"
    # a block that defines the entry point wins over a later usage example
    text = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert extract_code(text, "add").startswith("def add(a, b):")
    assert extract_code(text).startswith("print(add")
    # other languages only when there is nothing else; an unclosed fence runs to the end
    assert extract_code("```bash\nls\n```\n```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```text\nonly this\n```") == "only this\n"
    assert extract_code("Sure!\n```python\ndef f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("  ```python\n  indented = True\n  ```") == "  indented = True\n"


def test_solution_program_body_or_whole_function_and_tests_kept_out():
    body = solution_program("    return a + b\n", ADD_META)
    whole = solution_program("def add(a, b):\n    return a + b\n", ADD_META)
    for program in (body, whole):
        scope: dict = {}
        exec(program, scope)  # trusted here: our own test strings
        assert scope["add"](2, 3) == 5
        assert "check" not in program and "assert" not in program  # the tests never enter the sandbox
    spec = function_test(ADD_META)
    assert spec.test == ADD_META["test"] and spec.entry_point == "add" and spec.prefix == ADD_META["code_prefix"]


def code_reward(**options):
    return REWARDS.bind("code", options)


@needs_bwrap
def test_function_tests_all_pass_and_statuses():
    completions = [
        "```python\ndef add(a, b):\n    return a + b\n```",  # whole function, fenced
        "    return a + b\n",  # only the body
        "    return a - b\n",  # wrong
        "```python\ndef add(a, b)\n    return a + b\n```",  # syntax error
        "    while True:\n        pass\n",  # hangs
        "    return [0] * (10 ** 10)\n",  # memory
        "    import sys\n    sys.exit(0)\n",  # tries to skip the tests
        "import os\nos._exit(0)\n",  # exits hard before the tests run
        # a main block is not run (as in the reference harness), so its input() is harmless
        "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(add(int(input()), 1))\n",
        "import sys\nprint(sys.stdin.read())\ndef add(a, b):\n    return a + b\n",  # stdin is empty
    ]
    metas = [dict(ADD_META) for _ in completions]
    rewards = code_reward(timeout_s=3.0, memory_mb=256)(completions, [None] * len(completions), metas)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    statuses = [m["sandbox_status"] for m in metas]
    assert statuses == ["ok", "ok", "failed", "syntax_error", "timeout", "memory", "failed", "failed", "ok", "ok"]
    assert [m["tests_passed"] for m in metas] == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]


@needs_bwrap
def test_plain_assert_tests_without_entry_point():
    meta = {"test": "assert square(3) == 9\nassert square(-2) == 4\n"}
    good, bad = dict(meta), dict(meta)
    r = code_reward()(["def square(x):\n    return x * x", "def square(x):\n    return 2 * x"], [None, None], [good, bad])
    assert r == [1.0, 0.0] and good["sandbox_status"] == "ok" and bad["sandbox_status"] == "failed"


@needs_bwrap
def test_stdin_stdout_cases_all_pass_and_fraction():
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    half = "a, b = map(int, input().split())\nprint(a + b if a != 5 else -1)"  # fails the second case
    crash = "raise SystemExit(input() and 2)"
    completions = [right, half, crash]
    for mode, expected in [("all_pass", [1.0, 0.0, 0.0]), ("fraction", [1.0, 2 / 3, 0.0])]:
        metas = [{"cases": ECHO_CASES} for _ in completions]
        assert code_reward(mode=mode)(completions, [None] * 3, metas) == pytest.approx(expected)
        assert [m["sandbox_status"] for m in metas] == ["ok", "ok", "failed"]
        assert [m["tests_passed"] for m in metas] == [3, 2, 0]
        assert all(m["tests_total"] == 3 for m in metas)


@needs_bwrap
def test_per_sample_timeout_and_worst_status():
    slow = "import time\nx = input()\ntime.sleep(30 if x.startswith('5') else 0)\na, b = map(int, x.split())\nprint(a + b)"
    meta = {"cases": ECHO_CASES, "timeout_s": 2.0}
    assert code_reward(mode="fraction")([slow], [None], [meta]) == pytest.approx([2 / 3])
    assert meta["sandbox_status"] == "timeout"


def test_bad_meta_and_options():
    from upslope.errors import ConfigError

    with pytest.raises(DataError, match="meta needs 'test'"):
        code_reward()(["x = 1"], [None], [{}])
    with pytest.raises(DataError, match="non-empty list"):
        code_reward()(["x = 1"], [None], [{"cases": []}])
    with pytest.raises(ConfigError, match="mode"):
        code_reward(mode="most")
    assert REWARDS.get("code").traits.batched is True
