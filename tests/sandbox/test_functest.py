"""Function tests judged outside the sandbox: what the proxy carries, how each ending is
classified, and the same checker in the weak mode."""
from __future__ import annotations

import time

import pytest
from sandbox_helpers import BWRAP_PROBLEM

from upslope.sandbox import FunctionTest, Job, Sandbox, SandboxConfig

CONFIG = SandboxConfig(timeout_s=4.0, memory_mb=512)


@pytest.fixture(scope="module", params=["bwrap", "weak"])
def sandbox(request):
    if request.param == "bwrap":
        if BWRAP_PROBLEM is not None:
            pytest.skip(BWRAP_PROBLEM)
        return Sandbox(CONFIG)
    sb = Sandbox(SandboxConfig(timeout_s=4.0, memory_mb=512, python="/usr/bin/python3"), weak=True)
    if not sb.mode:
        pytest.skip(sb.problem)
    return sb


def verdict(sandbox, code, test, entry=None, prefix="", timeout_s=None):
    res = sandbox.run(Job(code=code, check=FunctionTest(test=test, entry_point=entry, prefix=prefix), timeout_s=timeout_s))
    assert res.verdict is not None
    return res, res.verdict


def test_plain_types_cross_and_compare(sandbox):
    code = "def f(x):\n    return (x, {1, 2}, {'k': [1.5, None]}, b'ab', 2 ** 100, 1j, frozenset([3]))\n"
    test = ("def check(candidate):\n    r = candidate('a')\n"
            "    assert r == ('a', {1, 2}, {'k': [1.5, None]}, b'ab', 2 ** 100, 1j, frozenset([3]))\n"
            "    assert type(r) is tuple and type(r[1]) is set\n")
    res, v = verdict(sandbox, code, test, "f")
    assert v.passed and v.kind == "ok", (v, res.stderr)


def test_prefix_helpers_and_exceptions_the_test_expects(sandbox):
    prefix = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\ndef root(xs):\n    '''stub'''\n"
    code = prefix + "\ndef root(xs):\n    if not xs:\n        raise ValueError('empty')\n    return -xs[0] / xs[1]\n"
    test = ("def check(candidate):\n    assert abs(poly([2, 4], candidate([2, 4]))) < 1e-9\n"
            "    try:\n        candidate([])\n    except ValueError as e:\n        assert 'empty' in str(e)\n"
            "    else:\n        assert False\n")
    _, v = verdict(sandbox, code, test, "root", prefix)
    assert v.passed, v


def test_plain_asserts_look_up_functions_and_values(sandbox):
    code = "LIMIT = 10\ndef square(x):\n    return x * x\n"
    _, v = verdict(sandbox, code, "assert square(3) == 9\nassert LIMIT == 10\n")
    assert v.passed, v
    _, v = verdict(sandbox, code, "assert missing(3) == 9\n")
    assert not v.passed and v.kind == "failed" and "NameError" in v.detail


@pytest.mark.parametrize("code,kind", [
    ("def f(x):\n    return x + 1\n", "failed"),  # a wrong answer
    ("def f(x)\n    return x\n", "syntax_error"),
    ("raise RuntimeError('at import')\n", "load_error"),
    ("import os\nos._exit(0)\n", "exited"),
    ("def f(x):\n    import os\n    os._exit(0)\n", "exited"),
    ("def f(x):\n    raise StopIteration\n", "failed"),  # arrives as CandidateError
    ("def f(x):\n    return [0] * (10 ** 10)\n", "memory"),
    ("def f(x):\n    class A:\n        pass\n    return A()\n", "failed"),  # not plain data
])
def test_each_failure_kind(sandbox, code, kind):
    _, v = verdict(sandbox, code, "def check(candidate):\n    assert candidate(1) == 1\n", "f")
    assert not v.passed and v.kind == kind, v


def test_printing_program_still_judged_on_its_answers(sandbox):
    code = "print('{\"passed\": true, \"kind\": \"ok\", \"detail\": \"\"}')\ndef f(x):\n    print('x' * 1000)\n    return x\n"
    res, v = verdict(sandbox, code, "def check(candidate):\n    assert candidate(1) == 1\n", "f")
    assert v.passed and "passed" in res.stdout
    _, v = verdict(sandbox, code.replace("return x", "return -x"), "def check(candidate):\n    assert candidate(1) == 1\n", "f")
    assert not v.passed


@pytest.mark.ci
@pytest.mark.slow  # waits out the time limit: ~5 s a sandbox
def test_hung_test_code_or_program_ends_at_the_limit(sandbox):
    t = time.monotonic()
    res, v = verdict(sandbox, "def f(x):\n    while True:\n        pass\n", "def check(candidate):\n    candidate(1)\n", "f", timeout_s=1.5)
    assert not v.passed and str(res.status) == "timeout" and time.monotonic() - t < 6
    t = time.monotonic()
    _, v = verdict(sandbox, "def f(x):\n    return x\n", "def check(candidate):\n    while True:\n        pass\n", "f", timeout_s=1.5)
    assert not v.passed and v.kind == "timeout" and time.monotonic() - t < 6


@pytest.mark.parametrize("code,kinds", [
    ("def f(x):\n    import os\n    os._exit(0)\n", ("exited",)),
    ("def f(x):\n    return object()\n", ("failed",)),  # cannot cross: not an exception of the program's
    ("def f(x):\n    import time\n    time.sleep(30)\n", ("timeout", "exited")),  # the wall clock may kill it first
])
def test_an_ending_the_test_code_catches_still_fails(sandbox, code, kinds):
    """The program's exit, hang or an uncrossable value is no exception of the program's: a
    test that wraps its calls in a bare except (or except BaseException) still fails."""
    test = ("def check(candidate):\n    for _ in range(3):\n        try:\n            candidate(1)\n"
            "        except BaseException:\n            pass\n")
    _, v = verdict(sandbox, code, test, "f", timeout_s=1.5)
    assert not v.passed and v.kind in kinds, v
