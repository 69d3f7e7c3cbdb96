"""What a sandboxed program sees of the file system: an allow-list, not the host's root.

Visible, read-only: /usr (and the /bin, /lib, /lib64, /sbin links or directories beside
it), a few files of /etc that programs and the dynamic loader read, and the interpreter's
install prefixes (a virtualenv and the Python it was made from). Fresh: /proc, a minimal
/dev, and a writable /tmp and /dev/shm. Nothing else exists inside: no /var, /srv, /opt,
/mnt, /home, /root, /run, /sys, no project directory, data set or model cache, and so no
host socket file or FIFO to connect to or write into.

The interpreter may live anywhere, /tmp and /dev/shm included: its prefixes are bound after
the run's fresh /tmp and /dev/shm (`interpreter_args` goes after the tmpfs arguments), at the
path the program is started with and at its resolved path, so a virtualenv under /tmp, one
reached through a symlink, and the base Python a virtualenv names in pyvenv.cfg are all seen.

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


# Mount points the sandbox builds itself; an interpreter prefix may lie below one but not be one.
RUN_MOUNTS = ("/tmp", "/dev/shm", "/dev", "/proc")


def _prefix_of(executable: str) -> str:
    """The install prefix of an interpreter: the directory above `bin/`, else its own directory."""
    parent = os.path.dirname(executable)
    return os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent


def _venv_home(prefix: str) -> str | None:
    """The base interpreter's directory that a virtualenv's pyvenv.cfg names (`home = ...`)."""
    try:
        with open(os.path.join(prefix, "pyvenv.cfg")) as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip() == "home" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def interpreter_roots(python: str) -> list[str]:
    """Directories the interpreter needs: every install prefix along its symlink chain, the base
    installation a virtualenv was made from (pyvenv.cfg `home`), each both as named and resolved."""
    roots: set[str] = set()
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # not another venv of the same base
        roots.update({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    todo, seen = [os.path.abspath(python)], set()
    while todo and len(seen) < 40:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        prefix = _prefix_of(path)
        roots.add(prefix)
        home = _venv_home(prefix)
        if home:
            base = os.path.join(home, "python3")
            todo.append(base if os.path.exists(base) else os.path.join(home, "python"))
            roots.add(_prefix_of(os.path.join(home, "python")))
        if os.path.islink(path):
            todo.append(os.path.join(os.path.dirname(path), os.readlink(path)))
    out = {os.path.realpath(r) for r in roots} | {os.path.abspath(r) for r in roots}
    # /usr is bound anyway; a root that is a system directory itself would widen the view
    return sorted(r for r in out if r not in ("/", "/usr", "/usr/local") and os.path.isdir(r))


def interpreter_problem(python: str) -> str | None:
    """One line when the sandbox cannot show this interpreter to a program, else None."""
    for root in interpreter_roots(python):
        if root in RUN_MOUNTS or any(m.startswith(root + "/") for m in RUN_MOUNTS):
            return (f"the interpreter {python} is installed directly in {root}, which the sandbox replaces "
                    "with a fresh one; install it (or its virtualenv) in a directory of its own")
    return None


def system_args() -> list[str]:
    """bubblewrap arguments for the read-only system part of the program's view."""
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
    return args


def interpreter_args(python: str) -> list[str]:
    """bubblewrap arguments that show the interpreter's install, read-only; they come after the
    run's /tmp and /dev/shm are mounted, so that a prefix below them is not hidden."""
    args: list[str] = []
    made: set[str] = set(RUN_MOUNTS)  # exist already, with their own modes
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
