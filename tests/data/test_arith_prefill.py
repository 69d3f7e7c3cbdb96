"""The arith task's `carries` field (a cluster key) by hand, and a prefilled reply (`prefill`) through
the real SmolLM2 tokenizer and chat template: the same prompt tokens as headroom.yaml's inline template."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from upslope.data.prompts import encode_prompts
from upslope.data.tasks import arith, carries
from upslope.data.types import Example
from upslope.models import load_tokenizer

HEADROOM = Path(__file__).resolve().parents[2] / "recipes" / "headroom.yaml"


@pytest.mark.parametrize("a,b,op,want", [
    (57, 25, "+", 1), (12, 34, "+", 0), (95, 99, "+", 2), (99, 1, "+", 2),  # column carries
    (50, 27, "-", 1), (27, 50, "-", 1), (100, 1, "-", 2), (44, 12, "-", 0),  # borrows of max - min
    (9, 6, "*", 1), (2, 3, "*", 0), (25, 34, "*", 2)])  # digit products >= 10: 5*4 = 20, 5*3 = 15
def test_carries_by_hand(a, b, op, want):
    assert carries(a, b, op) == want


def test_arith_examples_carry_the_field_and_the_prefill():
    ex = arith(ops="+", digits=2, count=50, prompt="{a} {op} {b} =", prefill="{a} {op} {b} =")
    assert all(e.meta["carries"] == carries(e.meta["a"], e.meta["b"], "+") for e in ex)
    assert {e.meta["carries"] for e in ex} == {0, 1, 2}
    assert ex[0].prefill == ex[0].prompt and arith(count=1)[0].prefill == ""


def test_a_prefill_opens_the_reply_as_headroom_does(smollm_path):
    plain, inline = load_tokenizer(smollm_path), load_tokenizer(smollm_path, yaml.safe_load(HEADROOM.read_text())
                                                                  ["model"]["chat_template"])
    opts = dict(ops="+", digits=2, count=30, prompt="{a} {op} {b} =")
    by_prefill, kept = encode_prompts(arith(**opts, prefill="{a} {op} {b} ="), plain)
    by_template, _ = encode_prompts(arith(**opts), inline)
    assert kept == list(range(30)) and by_prefill == by_template
    text = plain.decode(by_prefill[0])
    e = arith(**opts, prefill="{a} {op} {b} =")[0]
    assert text.endswith(f"<|im_start|>user\n{e.prompt}<|im_end|>\n<|im_start|>assistant\n{e.prefill}")
    asked = Example(prompt="What is 2 + 3? Then rate your confidence.", prefill="2 + 3 =")
    ids, _ = encode_prompts([asked], plain)
    assert plain.decode(ids[0]).endswith("What is 2 + 3? Then rate your confidence.<|im_end|>\n"
                                         "<|im_start|>assistant\n2 + 3 =")
    raw, _ = encode_prompts([asked], plain, use_chat_template=False)  # raw text: the turns joined
    assert plain.decode(raw[0]) == "What is 2 + 3? Then rate your confidence.\n\n2 + 3 ="
