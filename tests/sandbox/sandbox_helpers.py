"""Helpers of the sandbox tests (imported by name: pytest puts this folder on sys.path)."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator

import pytest
from hermetic import ROOT, SYSTEM_TMP

from upslope.sandbox import bwrap_problem

BWRAP_PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"sandbox unavailable: {BWRAP_PROBLEM}")


def _alive(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def pids_with_uid_in(uids: range | None) -> list[int]:
    """Live (not zombie) processes running as one of `uids` (the uids a sandbox uses as root)."""
    if uids is None:
        return []
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids and _alive(entry.name):
                    out.append(int(entry.name))
            except FileNotFoundError:
                pass
    return out


def pids_with_marker(marker: str) -> list[int]:
    """Live processes whose command line contains `marker`."""
    out = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if marker.encode() in f.read() and _alive(entry.name):
                    out.append(int(entry.name))
        except OSError:
            pass
    return out


CHECKER_MARK = "def judge(spec, rfd, wfd):"  # in the checker's command line (python -c CHECKER_SOURCE)


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def socket_memory() -> int:
    """Bytes in TCP and UDP buffers host-wide (the kernel's counters are global, not per namespace)."""
    pages = 0
    with open("/proc/net/sockstat") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] in ("TCP:", "UDP:") and "mem" in fields:
                pages += int(fields[fields.index("mem") + 1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def run_mounts(pid: int | None = None) -> list[str]:
    """The host mount points of the runs' own tmpfs (upslope.sandbox.mounts.RunTmpfs); with `pid`, only those
    of the sandboxes that process made."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split(" - ")
            if len(parts) == 2 and parts[1].split()[:2] == ["tmpfs", "upslope-sandbox"]:
                path = parts[0].split()[4]
                if pid is None or os.path.basename(path).startswith(f"upslope-run-{pid}-"):
                    out.append(path)
    return out


def mounted_usage(mount: str) -> os.statvfs_result | None:
    """statvfs of the filesystem mounted at `mount`, or None once it is no longer mounted there: a run
    detaches its tmpfs as it ends, and a statvfs of the bare directory left behind reads the host's disk."""
    try:
        fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:  # the open fd keeps the tmpfs it reached, so checking that it is a mount and reading it agree
        if os.fstat(fd).st_dev == os.stat(os.path.dirname(mount)).st_dev:
            return None
        return os.fstatvfs(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def readable_package_copy() -> Iterator[str]:
    """A directory (for PYTHONPATH) holding a copy of the `upslope` package that any user can
    read: the checkout may sit where only its owner can enter (a clone under /root). It is made in
    the system temp dir: the session's own is open to its owner only. Removed after."""
    site = tempfile.mkdtemp(prefix="upslope-readable-", dir=SYSTEM_TMP)
    try:
        shutil.copytree(ROOT / "upslope", os.path.join(site, "upslope"), ignore=shutil.ignore_patterns("__pycache__"))
        for dirpath, _, filenames in os.walk(site):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        yield site
    finally:
        shutil.rmtree(site, ignore_errors=True)
