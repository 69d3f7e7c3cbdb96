"""What a user with no special rights can reach on the host. As root the weak mode runs a
program under an unprivileged uid of its own: that uid must be able to enter the interpreter's
install and the run's work directory, which a private temp dir (TMPDIR=~/tmp, a per-user
/run/user/UID) does not allow."""
from __future__ import annotations

import os
import stat
import tempfile

# Where a work directory goes when the temp dir is private: the usual shared temp dirs.
SHARED_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def others_can_enter(directory: str) -> bool:
    """Whether every directory from / down to `directory` lets other users pass (o+x)."""
    parts = os.path.abspath(directory).split("/")
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i]) or "/"
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def others_can_run(path: str) -> bool:
    """Whether other users can reach and execute `path` (and its symlink targets)."""
    real = os.path.realpath(path)
    if not all(others_can_enter(os.path.dirname(p)) for p in {os.path.abspath(path), real}):
        return False
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IXOTH and mode & stat.S_IROTH)


def shared_work_parent() -> str | None:
    """Where a run's work directory can go so that other users can enter it: the temp dir
    (TMPDIR) when they can, else the first shared temp dir they can; None when there is none."""
    for directory in (tempfile.gettempdir(), *SHARED_TEMP_DIRS):
        if os.path.isdir(directory) and os.access(directory, os.W_OK) and others_can_enter(directory):
            return directory
    return None
