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


@contextlib.contextmanager
def atomic_directory(target: Path, prefix: str = ".tmp-", durable: bool = False) -> Iterator[Path]:
    """Yield a temp directory beside `target`; on success it replaces `target` (fsynced first
    when `durable`), on any failure it is removed and `target` is untouched."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield tmp
        if durable:
            fsync_tree(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
