"""Per-run control groups: one memory and process-count limit for everything a run starts.

cgroup v2 (a unified hierarchy holding the memory and pids controllers) is used where this
process may create groups at the hierarchy's root; otherwise cgroup v1 (separate memory and
pids hierarchies, as in many containers and VMs). The hierarchies are found where they are
mounted (/proc/self/mounts): on a "hybrid" host the controllers sit on v1 and the v2 mount
beside them (/sys/fs/cgroup/unified) holds none, so v1 is the one used. Otherwise none, and
the caller falls back to per-process rlimits plus a supervisor that sums the run's resident
memory (`tree_pids`, `rss_bytes`). `available()` probes once and says which, or why none.
"""
from __future__ import annotations

import atexit
import functools
import os
import signal
import threading
import time

_V2_ROOT = "/sys/fs/cgroup"
_counter = iter(range(1 << 62))
_counter_lock = threading.Lock()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cgroup_mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, "cgroup" or "cgroup2", mount options) of every cgroup file system."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 3 and parts[2] in ("cgroup", "cgroup2"):
                    out.append((parts[1].replace("\\040", " "), parts[2], set(parts[3].split(","))))
    except OSError:
        pass
    return out


def v2_root() -> str | None:
    """The cgroup v2 mount that holds the memory and pids controllers, if any."""
    for point, kind, _ in sorted(_cgroup_mounts(), key=lambda m: m[0] != _V2_ROOT):
        if kind == "cgroup2" and {"memory", "pids"} <= set(_read(os.path.join(point, "cgroup.controllers")).split()):
            return point
    return None


def v1_roots() -> dict[str, str]:
    """controller -> mount point of the cgroup v1 hierarchies of memory and pids that exist."""
    found = {}
    for point, kind, options in _cgroup_mounts():
        for controller in ("memory", "pids"):
            if kind == "cgroup" and controller in options and controller not in found:
                found[controller] = point
    return found


class RunGroup:
    """The cgroup(s) of one run: limits set, processes entered through `procs_files`."""

    def __init__(self, version: int, dirs: dict[str, str]):
        self.version = version
        self.dirs = dirs  # controller ("memory", "pids", or "unified") -> directory

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes its pid to, to enter the run's group(s)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            out.update(int(x) for x in _read(f).split())
        return out

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for passing its memory limit."""
        if self.version == 2:
            events = _read(os.path.join(self.dirs["unified"], "memory.events"))
        else:
            events = _read(os.path.join(self.dirs["memory"], "memory.oom_control"))
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip() not in ("", "0"):
                return True
        return False

    def peak_bytes(self) -> int:
        """The run's peak memory (0 where the kernel does not report it)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        text = _read(os.path.join(self.dirs["unified" if self.version == 2 else "memory"], name)).strip()
        return int(text) if text.isdigit() else 0

    def kill_all(self) -> None:
        """SIGKILL every process in the run's group(s), until none is left."""
        if self.version == 2 and os.path.exists(os.path.join(self.dirs["unified"], "cgroup.kill")):
            try:
                _write(os.path.join(self.dirs["unified"], "cgroup.kill"), "1")
            except OSError:
                pass
        for _ in range(400):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and delete the group(s)."""
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(200):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # the last processes are still being torn down
                    time.sleep(0.005)


class Cgroups:
    """Makes RunGroups under a parent group of this process's own."""

    def __init__(self, version: int, parents: dict[str, str]):
        self.version = version
        self.parents = parents

    def remove(self) -> None:
        """Delete the parent group(s) (at exit; runs still in flight keep them)."""
        for d in self.parents.values():
            try:
                os.rmdir(d)
            except OSError:
                pass

    def new_run(self, memory_bytes: int, max_pids: int) -> RunGroup:
        with _counter_lock:
            name = f"run-{next(_counter)}"
        dirs = {c: os.path.join(p, name) for c, p in self.parents.items()}
        group = RunGroup(self.version, dirs)
        try:
            for d in dirs.values():
                os.mkdir(d)
            if self.version == 2:
                d = dirs["unified"]
                _write(os.path.join(d, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "pids.max"), str(max_pids))
            else:
                _write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), str(memory_bytes))
                swap = os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes")
                if os.path.exists(swap):
                    try:
                        _write(swap, str(memory_bytes))
                    except OSError:
                        pass
                _write(os.path.join(dirs["pids"], "pids.max"), str(max_pids))
        except OSError:
            group.remove()
            raise
        return group


def _setup_v2() -> Cgroups:
    root = v2_root()
    if root is None:
        raise OSError("no cgroup v2 mount holds the memory and pids controllers")
    _write(os.path.join(root, "cgroup.subtree_control"), "+memory +pids")
    parent = os.path.join(root, f"upslope-sandbox-{os.getpid()}")
    os.makedirs(parent, exist_ok=True)
    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
    return Cgroups(2, {"unified": parent})


def _setup_v1() -> Cgroups:
    roots = v1_roots()
    missing = [c for c in ("memory", "pids") if c not in roots]
    if missing:
        raise OSError(f"no cgroup v1 {' and '.join(missing)} hierarchy is mounted")
    parents = {}
    for controller, root in roots.items():
        parents[controller] = os.path.join(root, f"upslope-sandbox-{os.getpid()}")
        os.makedirs(parents[controller], exist_ok=True)
    hier = os.path.join(parents["memory"], "memory.use_hierarchy")
    if os.path.exists(hier) and _read(hier).strip() != "1":
        try:
            _write(hier, "1")
        except OSError:
            pass
    return Cgroups(1, parents)


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def sweep_stale() -> None:
    """Remove the groups of sandboxes whose process is gone (a trainer killed mid-run)."""
    v2 = v2_root()
    for root in {*([v2] if v2 else []), *v1_roots().values()}:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            pid = name.rpartition("-")[2]
            if not name.startswith("upslope-sandbox-") or not pid.isdigit() or _pid_alive(int(pid)):
                continue
            parent = os.path.join(root, name)
            runs = [os.path.join(parent, r) for r in os.listdir(parent) if r.startswith("run-")]
            version = 2 if root == v2 else 1
            for run in runs:
                RunGroup(version, {"unified" if version == 2 else "x": run}).remove()
            try:
                os.rmdir(parent)
            except OSError:
                pass


@functools.lru_cache(maxsize=None)
def available() -> tuple[Cgroups | None, str]:
    """(the cgroup maker, "") where per-run groups work here; else (None, why not)."""
    sweep_stale()
    reasons = []
    for setup in (_setup_v2, _setup_v1):
        try:
            maker = setup()
            maker.new_run(64 << 20, 8).remove()  # a real probe: create, limit, delete
            atexit.register(maker.remove)
            return maker, ""
        except OSError as exc:
            reasons.append(f"{setup.__name__[7:]}: {exc}")
    return None, "; ".join(reasons)


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants (the fallback's view of a run)."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                todo += [int(x) for x in _read(f"/proc/{p}/task/{tid}/children").split()]
        except OSError:
            pass
    return out


def rss_bytes(pids) -> int:
    """Summed resident memory of `pids`."""
    total = 0
    for p in pids:
        for line in _read(f"/proc/{p}/status").splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) << 10
                break
    return total


def raise_oom_score(pids) -> None:
    """Put every process of a run back at oom_score_adj 1000 (the OOM killer's first choice)."""
    for p in pids:
        try:
            with open(f"/proc/{p}/oom_score_adj", "r+") as f:
                if f.read().strip() != "1000":
                    f.seek(0)
                    f.write("1000")
        except OSError:
            pass
