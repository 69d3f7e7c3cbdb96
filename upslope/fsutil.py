"""Atomic writes of whole directories: build in a temp sibling, then rename into place, so
a reader (or a crash) never sees a half-written directory."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


@contextlib.contextmanager
def atomic_directory(target: Path, prefix: str = ".tmp-", durable: bool = False,
                     replace: bool = False) -> Iterator[Path]:
    """Yield a temp directory beside `target`; on success it takes `target`'s place (fsynced
    first when `durable`), on any failure it is removed and `target` is untouched. An existing
    non-empty `target` is replaced only with `replace` (moved aside, removed once the new one is
    in place); otherwise it is an error and nothing is written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _refuse_existing(target, replace)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield tmp
        if durable:
            fsync_tree(tmp)
        _refuse_existing(target, replace)
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{prefix}old-", dir=target.parent)) / "x"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old.parent, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _refuse_existing(target: Path, replace: bool) -> None:
    from upslope.errors import UpslopeError

    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UpslopeError(f"{target}: exists and is a file or a link, not a directory; not replacing it")
    if target.exists() and not replace and not is_empty_dir(target):
        raise UpslopeError(f"{target}: directory exists and is not empty; not replacing it")


def check_run_dir(path: Path, resuming: bool) -> None:
    """Fail in one line, before any work, when `run_dir` cannot hold a run: a file is in the way,
    it cannot be created or written, or (for a fresh run) it holds an earlier run's checkpoints
    or metrics, which a fresh run would overwrite."""
    from upslope.errors import ConfigError

    for p in [path, *path.parents]:
        if p.exists():
            if not p.is_dir():
                what = "is a file" if p == path else f"is under {p}, which is a file"
                raise ConfigError(f"run_dir={path}: {what}; expected a directory")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"run_dir={path}: cannot create it ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir={path}: not writable (read-only file system or no permission)")
    if resuming:
        return
    earlier = [p.name for p in (path / "checkpoints", path / "metrics.jsonl", path / "rft_samples.jsonl")
               if (p.is_dir() and any(p.iterdir())) or (p.is_file() and p.stat().st_size)]
    if earlier:
        raise ConfigError(f"run_dir={path}: holds an earlier run ({', '.join(earlier)}) that a fresh run would "
                          f"overwrite; continue it with train.resume=latest, or choose another run_dir")


def check_regular_file(path: Path, what: str, error: type[Exception] | None = None) -> None:
    """One error line (`error`, default UpslopeError) when an existing non-directory `path` is not a
    regular file: reading a FIFO waits for a writer forever, a device (/dev/zero) never ends."""
    from upslope.errors import UpslopeError

    if path.exists() and not path.is_dir() and not path.is_file():
        raise (error or UpslopeError)(f"{path}: {what} is not a regular file (a FIFO, socket or device); expected a file")


def read_text_file(path: Path, what: str) -> str:
    """The UTF-8 text of a user's file, or one UpslopeError line naming `what` and the path
    (missing, a directory, a FIFO or device, unreadable, binary or not UTF-8)."""
    from upslope.errors import UpslopeError

    if not path.exists():
        raise UpslopeError(f"{path}: {what} not found")
    if path.is_dir():
        raise UpslopeError(f"{path}: {what} is a directory, expected a file")
    check_regular_file(path, what)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UpslopeError(f"{path}: cannot read {what} ({exc.strerror})") from None
    if b"\x00" in data:
        raise UpslopeError(f"{path}: {what} is a binary file, expected UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UpslopeError(f"{path}:{line}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} "
                           f"at offset {exc.start})") from None
