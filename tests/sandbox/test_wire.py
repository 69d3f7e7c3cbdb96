"""The plain-data codec between the sandbox and the checker: exact round trips of built-in
values, and nothing else gets through."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upslope.sandbox.functest import CHECKER_SOURCE, parse_verdict
from upslope.sandbox.wire import WireError, decode, dumps, encode, loads

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary() | st.complex_numbers(allow_nan=False)
hashables = st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.tuples(c, c) | st.frozensets(c, max_size=3), max_leaves=8)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=4) | st.tuples(c, c) | st.dictionaries(hashables, c, max_size=3) | st.sets(hashables, max_size=3),
    max_leaves=12,
)


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@given(values)
def test_round_trip_keeps_value_and_exact_types(value):
    back = decode(loads(dumps(encode(value))))
    assert _same(value, back), (value, back)


def test_special_floats_and_big_ints():
    assert math.isnan(decode(encode(float("nan"))))
    assert decode(encode(float("-inf"))) == float("-inf")
    assert decode(encode(10**300)) == 10**300
    assert decode(encode((True, 1))) == (True, 1) and type(decode(encode(True))) is bool


class Yes:
    def __eq__(self, other):
        return True


class I(int):
    pass


class L(list):
    pass


@pytest.mark.parametrize("value", [Yes(), I(3), L([1]), [Yes()], {"k": I(1)}, (x for x in []), print, object()])
def test_objects_other_than_plain_builtins_cannot_cross(value):
    with pytest.raises(WireError):
        encode(value)


@pytest.mark.parametrize("tree", [
    {"x": 1}, {"i": "1e5"}, {"i": 5}, {"f": 1.5}, {"t": "ab"}, {"i": "1", "f": "2"}, {"d": [[[1], 2]]},
    {"s": [[1]]}, {"b": "zz"}, {"c": ["1"]}, {"i": "9" * 5000}, {"i": "--5"}, {"i": "\u00b2"}, {"i": " 5"}, 1, 1.5,
])
def test_malformed_or_unknown_trees_are_refused(tree):
    with pytest.raises(WireError):
        decode(tree)


def test_deep_nesting_is_refused():
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(WireError):
        encode(deep)
    with pytest.raises(WireError):
        decode(loads(b"[" * 100000 + b"]" * 100000))


def test_a_missing_or_odd_verdict_is_never_a_pass():
    assert parse_verdict(b"").passed is False and parse_verdict(b"").kind == "error"
    assert parse_verdict(b'{"passed": true, "kind": "failed", "detail": ""}\n').passed is False
    assert parse_verdict(b'{"passed": 1, "kind": "ok", "detail": ""}\n').kind == "error"
    assert parse_verdict(b'{"passed": true, "kind": "ok", "detail": ""}\n').passed is True
    assert "optimize=0" in CHECKER_SOURCE  # asserts in the tests survive even under python -O


@given(st.recursive(st.none() | st.booleans() | st.text(), lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=3), max_leaves=12))
def test_hand_written_json_is_what_json_reads(tree):
    import json

    assert json.loads(dumps(tree)) == tree


def test_lone_surrogates_and_framed_requests():
    with pytest.raises(WireError):
        dumps({"ok": "\ud800"})
    import io

    from upslope.sandbox.wire import frame, read_frame

    msg = {"op": "call", "name": "f", "args": [{"i": "1"}, "x\n"], "kwargs": {"d": []}}
    stream = io.BytesIO(frame(msg) + frame({"op": "get", "name": "g"}))
    assert read_frame(stream) == msg and read_frame(stream) == {"op": "get", "name": "g"} and read_frame(stream) is None
