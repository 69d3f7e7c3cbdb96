"""Checkpoints: written atomically (temp dir, fsync, rename), the last K kept, and an exact
resume (weights, optimiser, scheduler, every RNG, data-sampler position, step).

Layout: RUN/checkpoints/step_000010/{model/ (HF format; with LoRA only the adapter), trainer.pt,
config.yaml, COMPLETE}
and RUN/checkpoints/latest (a text file naming the newest complete checkpoint).
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from upslope import lora
from upslope.errors import UpslopeError
from upslope.fsutil import atomic_directory

MARKER = "COMPLETE"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(ckpt_dir: Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any],
                    config_yaml: str, keep_last: int) -> Path:
    """Write step `step`; a crash at any point leaves the previous `latest` intact."""
    final = ckpt_dir / f"step_{step:06d}"
    with atomic_directory(final, prefix=f".tmp-step_{step:06d}-", durable=True) as tmp:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(trainer_state, tmp / "trainer.pt")
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / MARKER).write_text(str(step))
    _write_text_atomic(ckpt_dir / "latest", final.name)
    _prune(ckpt_dir, keep_last)
    return final


def _prune(ckpt_dir: Path, keep_last: int) -> None:
    done = sorted(p for p in ckpt_dir.glob("step_*") if (p / MARKER).exists())
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_dir.glob(".tmp-step_*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)


def find_checkpoint(run_dir: Path, which: str) -> Path:
    """'latest' (the newest complete checkpoint of `run_dir`) or an explicit directory."""
    if which != "latest":
        path = Path(which)
        if not (path / MARKER).exists():
            raise UpslopeError(f"train.resume={which}: not a complete checkpoint directory")
        return path
    ckpt_dir = run_dir / "checkpoints"
    pointer = ckpt_dir / "latest"
    if pointer.exists():
        path = ckpt_dir / pointer.read_text().strip()
        if (path / MARKER).exists():
            return path
    done = sorted(p for p in ckpt_dir.glob("step_*") if (p / MARKER).exists())
    if not done:
        raise UpslopeError(f"train.resume=latest: no complete checkpoint in {ckpt_dir}")
    return done[-1]


def load_trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / "trainer.pt", weights_only=False)


def load_model_weights(model: Any, path: Path) -> None:
    """Copy the checkpoint's weights into `model` in place (same architecture); a LoRA
    checkpoint holds only the adapter, which goes into a LoRA-wrapped `model`."""
    from safetensors.torch import load_file

    adapter = lora.is_adapter_dir(path / "model")
    if adapter != lora.is_adapted(model):
        held, trains = ("a LoRA adapter", "the full model") if adapter else ("a full model", "a LoRA adapter")
        raise UpslopeError(f"{path}: checkpoint holds {held}, but this run trains {trains} "
                           f"(set lora.enabled as in the run that wrote it)")
    if adapter:
        lora.load_adapter(model, path / "model")
        return
    state: dict[str, torch.Tensor] = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise UpslopeError(f"{path}: checkpoint does not match the model (missing {real_missing[:3]}, "
                           f"unexpected {unexpected[:3]})")
