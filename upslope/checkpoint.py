"""Checkpoints: written atomically (temp dir, fsync, rename), the last K kept, and an exact
resume (weights, optimiser, scheduler, every RNG, data-sampler position, step).

Layout: RUN/checkpoints/step_000010/{model/ (HF format; with LoRA only the adapter), trainer.pt,
config.yaml, COMPLETE}
and RUN/checkpoints/latest (a text file naming the newest complete checkpoint).
"""
from __future__ import annotations

import errno
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from upslope import lora
from upslope.errors import UpslopeError
from upslope.fsutil import atomic_directory

MARKER = "COMPLETE"
SHARDED = "sharded"  # a sharded learner's weights and optimiser state (torch.distributed.checkpoint)


def first_nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    """Name of the first floating-point tensor holding NaN or inf (nested dicts/lists searched)."""
    for name, value in named:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and value.numel() and not bool(torch.isfinite(value).all()):
                return name
        elif isinstance(value, dict):
            found = first_nonfinite((f"{name}.{k}", v) for k, v in value.items())
            if found:
                return found
        elif isinstance(value, (list, tuple)):
            found = first_nonfinite((f"{name}[{i}]", v) for i, v in enumerate(value))
            if found:
                return found
    return None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # (a CPU checkpoint has none; extra saved GPUs are dropped)
        for index, cuda_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(ckpt_dir: Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any],
                    config_yaml: str, keep_last: int, weights: dict[str, torch.Tensor] | None = None,
                    sharded: Path | None = None) -> Path:
    """Write step `step`; a crash at any point leaves the previous `latest` intact. Non-finite
    weights or optimiser state are refused (one line), so no checkpoint ever holds NaN/inf. A
    sharded learner passes its gathered `weights` (for the HF-format model/) and the directory
    of its DCP shards (`sharded`, moved in as sharded/)."""
    final = ckpt_dir / f"step_{step:06d}"
    bad = (first_nonfinite((model.state_dict() if weights is None else weights).items())
           or first_nonfinite([("trainer state", trainer_state)]))
    if bad:
        raise UpslopeError(f"checkpoint step {step}: refusing to save non-finite values (NaN/inf) in {bad}; "
                           f"the previous checkpoints in {ckpt_dir} are unchanged")
    if final.exists() and not is_checkpoint_dir(final):
        raise UpslopeError(f"{final}: exists and is not a checkpoint upslope wrote; not replacing it")
    try:
        with atomic_directory(final, prefix=f".tmp-step_{step:06d}-", durable=True, replace=True) as tmp:
            try:
                model.save_pretrained(tmp / "model", safe_serialization=True,
                                      **({} if weights is None else {"state_dict": weights}))
                if sharded is not None:
                    os.replace(sharded, tmp / SHARDED)
                tokenizer.save_pretrained(tmp / "model")
                torch.save(trainer_state, tmp / "trainer.pt")
                (tmp / "config.yaml").write_text(config_yaml)
                (tmp / MARKER).write_text(str(step))
            except Exception as exc:
                if _disk_full(tmp):  # torch's zip writer reports a full disk as "unexpected pos ..."
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from exc
                raise
        _write_text_atomic(ckpt_dir / "latest", final.name)
    except UpslopeError:
        raise
    except Exception as exc:  # a full or failing disk (the tokenizer's writer raises a plain Exception)
        reason = getattr(exc, "strerror", None) or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise UpslopeError(f"{final}: could not write the checkpoint ({reason}); the previous checkpoints in "
                           f"{ckpt_dir} are unchanged") from None
    _prune(ckpt_dir, keep_last)
    return final


def _disk_full(path: Path, margin: int = 1 << 20) -> bool:
    """Is the filesystem holding `path` (nearly) full? Checked before the partial files are removed."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < margin


STEP_DIR = re.compile(r"step_(\d{6,})")
STALE_DIR = re.compile(r"\.tmp-step_\d{6,}-(old-)?[A-Za-z0-9_]+")


def is_checkpoint_dir(path: Path) -> bool:
    """Did upslope write this directory as a checkpoint? Its name is step_NNNNNN, its COMPLETE
    marker holds that step, and it has trainer.pt and model/ (only these are ever pruned)."""
    m = STEP_DIR.fullmatch(path.name)
    if not m or path.is_symlink() or not path.is_dir():
        return False
    try:
        marker = (path / MARKER).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False
    return marker == str(int(m.group(1))) and (path / "trainer.pt").is_file() and (path / "model").is_dir()


def _prune(ckpt_dir: Path, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints; remove older ones and temp dirs a crash left,
    touching nothing upslope did not recognisably write."""
    done = sorted((p for p in ckpt_dir.glob("step_*") if is_checkpoint_dir(p)),
                  key=lambda p: int(p.name.removeprefix("step_")))
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in ckpt_dir.glob(".tmp-step_*"):  # left by a crash mid-write (mkdtemp names)
        if STALE_DIR.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
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
    try:
        name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    except (OSError, UnicodeDecodeError):
        name = ""  # a damaged pointer: fall back to the newest complete checkpoint
    if STEP_DIR.fullmatch(name) and is_checkpoint_dir(ckpt_dir / name):
        return ckpt_dir / name
    done = sorted((p for p in ckpt_dir.glob("step_*") if is_checkpoint_dir(p)),
                  key=lambda p: int(p.name.removeprefix("step_")))
    if not done:
        raise UpslopeError(f"train.resume=latest: no complete checkpoint in {ckpt_dir}")
    return done[-1]


def load_trainer_state(path: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint; a missing, truncated or corrupt trainer.pt is one line."""
    file = path / "trainer.pt"
    if not file.is_file():
        raise UpslopeError(f"{file}: missing; {path} is not a complete checkpoint")
    try:
        state = torch.load(file, weights_only=False, map_location="cpu")  # any device: the optimiser moves it
    except Exception as exc:  # torch raises many types for a damaged file (pickle, zip, EOF)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UpslopeError(f"{file}: cannot read the trainer state, the file is damaged ({first[:160]})") from None
    if not isinstance(state, dict) or not {"step", "optimizer", "scheduler", "rng"} <= set(state):
        raise UpslopeError(f"{file}: not an upslope trainer state (expected step, optimizer, scheduler, rng)")
    return state


def check_resume(path: Path, step: int, steps: int, final_eval: bool = False) -> None:
    """A checkpoint past train.steps, or at it with no final evaluation to run, leaves nothing to
    do: one line instead of a run that does nothing. At train.steps with `final_eval` the resumed
    run only evaluates (a run killed during its final evaluation finishes it)."""
    if step > steps or (step == steps and not final_eval):
        raise UpslopeError(f"train.resume={path}: the checkpoint is at step {step}, and train.steps={steps} "
                           f"leaves nothing to train (raise train.steps)")


def load_model_weights(model: Any, path: Path) -> None:
    """Copy the checkpoint's weights into `model` in place (same architecture); a LoRA
    checkpoint holds only the adapter, which goes into a LoRA-wrapped `model`."""
    if check_kind(path, lora.is_adapted(model)):
        lora.load_adapter(model, path / "model")
        return
    state = read_model_weights(path)
    own = model.state_dict()
    wrong = [k for k, v in state.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    if wrong:
        k = wrong[0]
        raise UpslopeError(f"{path}: checkpoint is of another model: {k} has shape {tuple(state[k].shape)}, this "
                           f"model's is {tuple(own[k].shape)} (resume with the model.name that wrote it)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise UpslopeError(f"{path}: checkpoint does not match the model (missing {real_missing[:3]}, "
                           f"unexpected {unexpected[:3]})")


def check_kind(path: Path, adapted: bool) -> bool:
    """Does the checkpoint hold a LoRA adapter (rather than a full model)? One line when that is
    not what this run trains (`adapted`)."""
    adapter = lora.is_adapter_dir(path / "model")
    if adapter != adapted:
        held, trains = ("a LoRA adapter", "the full model") if adapter else ("a full model", "a LoRA adapter")
        raise UpslopeError(f"{path}: checkpoint holds {held}, but this run trains {trains} "
                           f"(set lora.enabled as in the run that wrote it)")
    return adapter


def read_trained_weights(path: Path, adapted: bool) -> dict[str, torch.Tensor]:
    """What a one-process checkpoint trained, by the live model's parameter names, for a sharded
    learner to load: the adapter's weights for a LoRA run (the frozen base is loaded already),
    else the full model's."""
    if check_kind(path, adapted):
        return lora.adapter_weights(path / "model")
    return read_model_weights(path)


def read_model_weights(path: Path) -> dict[str, torch.Tensor]:
    """A full-model checkpoint's weights by HF name (model/*.safetensors); damaged files are one line."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    files = sorted((path / "model").glob("*.safetensors"))
    if not files:
        raise UpslopeError(f"{path / 'model'}: no .safetensors weights; not a complete checkpoint")
    for f in files:
        try:
            state.update(load_file(f))
        except Exception as exc:  # safetensors: truncated / corrupt header
            raise UpslopeError(f"{f}: cannot read the weights, the file is damaged or truncated "
                               f"({str(exc).splitlines()[0][:160]})") from None
    return state
