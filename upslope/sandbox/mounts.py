"""What a sandboxed program sees of the file system: an allow-list, not the host's root.

Visible, read-only: /usr (and the /bin, /lib, /lib64, /sbin links or directories beside
it), a few files of /etc that programs and the dynamic loader read, and the interpreter's
install prefixes (a virtualenv and the Python it was made from). Fresh: /proc, a minimal
/dev, and a writable /tmp and /dev/shm. Nothing else exists inside: no /var, /srv, /opt,
/mnt, /home, /root, /run, /sys, no project directory, data set or model cache, and so no
host socket file or FIFO to connect to or write into.

As root, /tmp and /dev/shm are one tmpfs per run mounted here with both a size and an
inode limit (bubblewrap's own --tmpfs has no inode option); otherwise bubblewrap's tmpfs,
with the size limit only.
"""
from __future__ import annotations

import ctypes
import os
import sys
import tempfile

_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/nsswitch.conf",
    "/etc/os-release",
)
_TOP = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def interpreter_roots(python: str) -> list[str]:
    """Directories the interpreter needs: every install prefix along its symlink chain."""
    roots: set[str] = set()
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        roots.update({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    path, seen = os.path.abspath(python), 0
    while seen < 40:
        parent = os.path.dirname(path)
        roots.add(os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent)
        if not os.path.islink(path):
            break
        path = os.path.join(parent, os.readlink(path))
        seen += 1
    out = {os.path.realpath(r) for r in roots} | {os.path.abspath(r) for r in roots}
    # /usr is bound anyway; a root that is a system directory itself would widen the view
    return sorted(r for r in out if r not in ("/", "/usr", "/usr/local") and os.path.isdir(r))


def allowlist_args(python: str) -> list[str]:
    """bubblewrap arguments that build the read-only part of the program's view."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in _TOP:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc"]
    for path in _ETC:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    made: set[str] = set()
    for root in interpreter_roots(python):
        if root.startswith("/usr/"):
            continue
        parts = root.strip("/").split("/")
        for i in range(1, len(parts)):  # bubblewrap would make missing parents 0700
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", root, root]
    return args


class RunTmpfs:
    """A tmpfs of one run with size and inode limits (root only), bound as /tmp and /dev/shm."""

    def __init__(self, size_bytes: int, inodes: int):
        self.path = tempfile.mkdtemp(prefix=f"upslope-run-{os.getpid()}-")
        opts = f"size={size_bytes},nr_inodes={inodes},mode=0755".encode()
        if _libc.mount(b"upslope-sandbox", self.path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
            err = ctypes.get_errno()
            os.rmdir(self.path)
            raise OSError(err, f"mounting the run's tmpfs: {os.strerror(err)}")
        for sub in ("tmp", "shm"):
            os.mkdir(os.path.join(self.path, sub))
            os.chmod(os.path.join(self.path, sub), 0o1777)

    def bwrap_args(self) -> list[str]:
        return ["--bind", f"{self.path}/tmp", "/tmp", "--bind", f"{self.path}/shm", "/dev/shm"]

    def remove(self) -> None:
        _libc.umount2(self.path.encode(), _MNT_DETACH)
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def sweep_stale_tmpfs() -> None:
    """Unmount the run tmpfs of sandboxes whose process is gone (a trainer killed mid-run)."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        fields, _, rest = line.partition(" - ")
        if rest.split()[:2] != ["tmpfs", "upslope-sandbox"]:
            continue
        path = fields.split()[4]
        pid = os.path.basename(path).split("-")[2:3]
        if pid and pid[0].isdigit() and not os.path.exists(f"/proc/{pid[0]}"):
            _libc.umount2(path.encode(), _MNT_DETACH)
            try:
                os.rmdir(path)
            except OSError:
                pass


def tmpfs_args(size_bytes: int) -> list[str]:
    """The unprivileged stand-in: bubblewrap's tmpfs, limited in size only."""
    size = str(size_bytes)
    return ["--perms", "1777", "--size", size, "--tmpfs", "/tmp", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
