"""The hop trace of one training step: which files of the package one step runs through, the
cross-file calls it makes, and the back-and-forth between files (A calls into B and B calls back
into A, e.g. through a callback).

    python scripts/hop_trace.py MODEL_DIR [key=value ...]

runs `upslope train` (GRPO by default) on MODEL_DIR with the HF engine for one step under
`sys.setprofile` and prints: the files in call order (those that call no other file marked as
leaves), each distinct cross-file call
(`caller_file:function -> callee_file:function`), and the pairs of files that call each other.
A call's caller is the nearest frame of the package on the stack, so a callback that the package
passes through torch or the standard library still counts as a call from the package file that
ran it. Calls into the package's own `__init__` files and its dataclass machinery count like any other.
"""
from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import upslope

PACKAGE = Path(upslope.__file__).resolve().parent


def package_file(frame: FrameType | None) -> str | None:
    """The frame's file relative to the package, or None when it is not the package's."""
    if frame is None:
        return None
    path = frame.f_code.co_filename
    if not path.startswith(str(PACKAGE)):
        return None
    return str(Path(path).relative_to(PACKAGE.parent))


def trace(fn: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """Run `fn()` under a profiler: the package files in order of first call, and the distinct
    cross-file calls as (caller 'file:function', callee 'file:function') in order of first call."""
    files: dict[str, None] = {}
    calls: dict[tuple[str, str], None] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = package_file(frame)
        if callee is None:
            return
        files.setdefault(callee)
        caller_frame = frame.f_back
        while caller_frame is not None and package_file(caller_frame) is None:
            caller_frame = caller_frame.f_back
        caller = package_file(caller_frame)
        if caller is not None and caller != callee:
            calls.setdefault((f"{caller}:{caller_frame.f_code.co_name}", f"{callee}:{frame.f_code.co_name}"))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return list(files), list(calls)


def back_and_forth(calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Pairs of files that call each other."""
    edges = {(a.partition(":")[0], b.partition(":")[0]) for a, b in calls}
    return sorted({tuple(sorted((a, b))) for a, b in edges if (b, a) in edges})  # type: ignore[misc]


def trainer_for(overrides: list[str]) -> Any:
    """The `upslope train` trainer for these overrides (the entry-point table, wherever it lives)."""
    from upslope.config import load_config

    for where in ("upslope.launch", "upslope.train.api"):  # the table's home now, and before the layers
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError:
            continue
        if hasattr(module, "trainer_class"):
            return module.trainer_class("train")(load_config(None, overrides))
    raise SystemExit("no trainer table found")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    model, extra = argv[0], argv[1:]  # e.g. smollm2-135m-instruct (the default model)
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"model.name={model}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
                     "log.tensorboard=false", "log.plot=false", "train.eval_before=false", "train.eval_after=false",
                     "train.eval_every=0", "train.deterministic=true", "train.steps=2", *extra]
        trainer = trainer_for(overrides)
        try:
            files, calls = trace(lambda: trainer.timed_step(1))
        finally:
            trainer.close()
    pairs = back_and_forth(calls)
    passing = {a.partition(":")[0] for a, _ in calls}
    print(f"files: {len(files)} ({len(passing)} of them call into another file, the rest are leaves)")
    for f in files:
        print(f"  {f}" + ("" if f in passing else "  (leaf)"))
    file_edges = sorted({(a.partition(":")[0], b.partition(":")[0]) for a, b in calls})
    print(f"cross-file calls: {len(calls)} between functions, {len(file_edges)} between files")
    for a, b in calls:
        print(f"  {a} -> {b}")
    print(f"back-and-forth: {len(pairs)}")
    for a, b in pairs:
        print(f"  {a} <-> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
