"""Keeping the test suite off the user's files: where it runs, and what it must not leave behind.

The suite runs in temporary directories (a working directory per session, per module and per
test, a temporary HOME, its own model cache and its own temporary directory), so a command a test
runs with the defaults (`run_dir=runs/default`, `~/.cache/upslope`, the system temp dir) writes
there and never into the checkout, the user's home or a shared /tmp. `snapshot` and
`new_or_changed` are the guard's two halves: what a tree holds before the session, and what is new
or changed in it after.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Written by the tools that run the suite, not by the tests: pytest's and hypothesis's own caches,
# compiled modules, git and the virtual environment that setup.sh makes.
NOT_GUARDED = frozenset({".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis"})
# Variables that would send a cache or configuration somewhere other than the temporary HOME.
HOME_REDIRECTS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
# The temp dir as the process found it: imported before `enter_session` points TMPDIR at the
# session's own (which only its owner may enter), so a test that must reach another user can use it.
SYSTEM_TMP = Path(tempfile.gettempdir())
# In the system temp dir, the sessions' own directories (this one's and those of sessions running
# beside it, each of which removes its own).
SESSION_PREFIX = "upslope-tests-"

Snapshot = dict[str, tuple[int, int]]  # relative path -> (size, mtime in ns); a directory has size -1


def snapshot(root: Path, skip: frozenset[str] = frozenset()) -> Snapshot:
    """Every file, directory and link under `root` (none when it does not exist), without the
    directories named in `skip`."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            size = -1 if name in dirnames and not os.path.islink(path) else st.st_size
            out[os.path.relpath(path, root)] = (size, st.st_mtime_ns)
    return out


def new_or_changed(before: Snapshot, after: Snapshot, *, changes: bool = True) -> list[str]:
    """Paths that appeared (or, with `changes`, whose file changed size or time), sorted; a new
    directory stands for everything under it."""
    new = sorted(p for p in after if p not in before)
    tops = [p for p in new if not any(p.startswith(q + os.sep) for q in new if q != p)]
    changed = sorted(p for p in after if p in before and changes and after[p][0] >= 0 and after[p] != before[p])
    return tops + changed


def top_level_names(directory: Path) -> frozenset[str]:
    """The names directly in `directory` (none when it cannot be listed)."""
    try:
        return frozenset(os.listdir(directory))
    except OSError:
        return frozenset()


def new_in_temp_dir(before: frozenset[str], directory: Path) -> list[str]:
    """Names in the temp dir `directory` that were not there `before`, sorted, without the test
    sessions' own directories."""
    return sorted(n for n in top_level_names(directory) - before if not n.startswith(SESSION_PREFIX))


@dataclass
class SessionDirs:
    """The temporary places of one test session, and what the guard compares at its end."""

    base: Path  # removed at the end of the session
    cwd: Path
    home: Path
    cache: Path
    user_cache: Path  # the cache the user's own runs use (the guard checks it is untouched)
    checkout_before: Snapshot
    user_cache_before: Snapshot
    kept_cache: bool  # the cache was given by UPSLOPE_TEST_CACHE: kept after the session
    system_tmp: Path  # the temp dir the session was started with (TMPDIR points into `base` during it)
    system_tmp_before: frozenset[str]  # the names directly in `system_tmp` when the session began

    def leftovers(self) -> list[str]:
        """One line per path the session left in the checkout or the system temp dir, or changed in
        the user's cache. The temp dir is compared by its top-level names only (it is shared: a
        process outside the suite that left something there meanwhile is named too)."""
        lines = [f"{ROOT / p}" for p in new_or_changed(self.checkout_before, snapshot(ROOT, NOT_GUARDED), changes=False)]
        if not self.user_cache.resolve().is_relative_to(self.base.resolve()):
            lines += [f"{self.user_cache / p}" for p in new_or_changed(self.user_cache_before, snapshot(self.user_cache))]
        lines += [f"{self.system_tmp / name}" for name in new_in_temp_dir(self.system_tmp_before, self.system_tmp)]
        return lines

    @property
    def tmp(self) -> Path:
        """The session's temp dir (TMPDIR)."""
        return self.base / "tmp"

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def enter_session() -> SessionDirs:
    """Point HOME, the model cache, the temp dir (TMPDIR, which pytest's `tmp_path`, torch's compile
    cache, vLLM's rendezvous file and Ray's session files follow) and the working directory at fresh
    temporary directories, after noting what the checkout, the user's cache and the system temp dir
    hold.

    The embedded model is converted once per session into the temporary cache (about 20 s); a
    developer who runs the suite often can keep one with UPSLOPE_TEST_CACHE=/some/dir."""
    from upslope.cache import cache_root

    user_cache = cache_root()
    system_tmp_before = top_level_names(SYSTEM_TMP)
    # Directly in the system temp dir, with a short name: Ray's unix sockets sit 66 bytes below TMPDIR
    # (ray/session_<time>_<pid>/sockets/plasma_store), and a socket's path may hold 107.
    base = Path(tempfile.mkdtemp(prefix=SESSION_PREFIX))
    kept = os.environ.get("UPSLOPE_TEST_CACHE")
    dirs = SessionDirs(base=base, cwd=base / "cwd", home=base / "home",
                       cache=Path(kept).expanduser().resolve() if kept else base / "cache", user_cache=user_cache,
                       checkout_before=snapshot(ROOT, NOT_GUARDED), user_cache_before=snapshot(user_cache),
                       kept_cache=bool(kept), system_tmp=SYSTEM_TMP, system_tmp_before=system_tmp_before)
    for d in (dirs.cwd, dirs.home, dirs.cache, dirs.tmp):
        d.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(dirs.tmp)
    tempfile.tempdir = None  # read TMPDIR again
    os.environ["HOME"] = str(dirs.home)
    # Ray keeps the token of the local clusters it starts in ~/.ray/auth_token, and a process that
    # started one remembers it has a token: a cluster started later under another test's HOME would
    # not find it (its GCS server exits). One token for the session, where every Ray process reads it.
    os.environ.setdefault("RAY_AUTH_TOKEN", uuid.uuid4().hex)
    os.environ["UPSLOPE_CACHE"] = str(dirs.cache)
    for name in HOME_REDIRECTS:
        os.environ.pop(name, None)
    # Subprocesses that tests start from their temporary working directories import this
    # checkout (not whatever the interpreter has installed), and a relative entry such as
    # PYTHONPATH=. would no longer point at it.
    paths = [str(ROOT)] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.chdir(dirs.cwd)
    return dirs
