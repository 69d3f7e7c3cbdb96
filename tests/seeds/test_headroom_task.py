"""The task with headroom (recipes/headroom.yaml): its prompts end with the question prefilled in
the assistant turn, through an inline chat template, on the real tokenizer and arith task."""
from __future__ import annotations

from pathlib import Path

from upslope.config import load_config
from upslope.data.prompts import encode_prompts
from upslope.data import load_examples
from upslope.models import load_tokenizer

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_headroom_prompt_prefills_the_question(smollm_path):
    cfg = load_config(str(RECIPES / "headroom.yaml"), [])
    assert cfg.data.task == "arith" and cfg.data.options["digits"] == 2 and cfg.train.steps == 60
    tok = load_tokenizer(smollm_path, chat_template=cfg.model.chat_template)  # inline text longer than a file name
    examples = load_examples(cfg.data, "train")[:3]
    ids, kept = encode_prompts(examples, tok)
    assert kept == [0, 1, 2]
    for ex, p in zip(examples, ids):
        a, b = ex.meta["a"], ex.meta["b"]
        assert 10 <= a <= 99 and 10 <= b <= 99 and ex.answer == a + b
        text = tok.decode(p)
        assert text.endswith(f"<|im_start|>user\n{a} + {b} =<|im_end|>\n<|im_start|>assistant\n{a} + {b} =")
        assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_method_recipes_build_on_the_headroom_task():
    base = load_config(str(RECIPES / "headroom.yaml"), [])
    for name, check in {"cero": lambda c: c.data.sampler.name == "cero",
                        "ads": lambda c: c.data.sampler.name == "boundary",
                        "boundary_curriculum": lambda c: c.data.sampler.name == "boundary_aware",
                        "replay": lambda c: c.algo.replay.name == "fresh_anchored" and c.algo.correction is not None,
                        "rerule": lambda c: c.algo.replay.name == "rerule" and c.algo.correction is not None}.items():
        cfg = load_config(str(RECIPES / f"{name}.yaml"), [])
        assert check(cfg), name
        assert cfg.data.options == base.data.options and cfg.model.chat_template == base.model.chat_template
