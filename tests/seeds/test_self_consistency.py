"""Self-CTRL's consistency reward against a hand computation (behaviour measured over a family's related
prompts), and the self_report task's families and held-out split."""
from __future__ import annotations

import pytest

from upslope.data.introspection import self_report
from upslope.rewards.introspection import report, self_consistency


def meta(target: str, other: str, family: str = "apple|river") -> dict:
    return {"family": family, "target": target, "other": other}


def test_report_parsing():
    m = meta("apple", "river")
    assert report(" apple, 70%", m) == ("apple", 0.7) and report(" River - 5 %", m) == ("river", 0.05)
    assert report(" 70%", m) is None and report(" stone, 70%", m) is None and report(" apple, 170%", m) is None


def test_consistency_by_hand():
    """Family apple|river, four well-formed replies choose apple, apple, river, apple (behaviour: apple 3/4,
    river 1/4) and one reply is malformed. Reports: 70% apple (gap 0.05), 100% apple (0.25), 25% about river
    (0), 50% about river from a prompt that asks about river (0.25); tolerance 0.2."""
    metas = [meta("apple", "river"), meta("apple", "river"), meta("river", "apple"), meta("river", "apple"),
             meta("apple", "river"), meta("stone", "cloud", "stone|cloud")]
    replies = [" apple, 70%", " apple, 100%", " river, 25%", " apple, 50%", " I pick", " stone, 100%"]
    got = self_consistency(replies, [None] * 6, metas, tolerance=0.2)
    assert got == pytest.approx([1 - 0.05 / 0.2, 0.0, 1.0, 0.0, 0.0, 1.0])  # the last family: 1 of 1 chose stone


def test_families_are_split_whole():
    train, test = self_report(split="train"), self_report(split="test")
    fam = lambda xs: {e.meta["family"] for e in xs}  # noqa: E731
    assert not fam(train) & fam(test) and len(fam(test)) == 30 and len(test) == 4 * 30  # 120 pairs, a quarter
    one = [e for e in test if e.meta["family"] == test[0].meta["family"]]
    assert {e.meta["target"] for e in one} == set(test[0].meta["family"].split("|")) and len(one) == 4
