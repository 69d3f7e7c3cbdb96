"""Run one untrusted program: isolate it, feed it, watch it, and say how it ended.

Isolation (see docs/sandbox.md for the threat model):
- bubblewrap gives the program its own PID, network, IPC and UTS namespaces and a file
  system built from an allow-list (upslope.sandbox.mounts): /usr, the interpreter's
  install, a few /etc files, fresh /proc, /dev, and a per-run /tmp and /dev/shm;
- as root the program runs under a uid of its own (one per concurrent run, from a random
  block), so RLIMIT_NPROC holds and it owns no host file; as an ordinary user bubblewrap
  maps the user into a fresh user namespace, where the process count is per namespace;
- the whole run sits in its own cgroup (v2, else v1) with a memory and a process limit
  where this host allows it; otherwise a supervisor sums the run's resident memory;
  everything in it has oom_score_adj 1000, so the kernel's OOM killer takes it first;
- `prlimit` sets RLIMIT_AS, _CPU, _NPROC, _NOFILE, _FSIZE and _CORE on the program only;
- a seccomp filter refuses new namespaces, mounts, ptrace and other rarely needed calls;
- a wall clock (the job's limit, or the batch's deadline when that comes first) kills the
  whole tree: the namespace's PID 1 (coreutils `timeout`) dies with its parent or at the
  limit, the kernel then kills everything left in the namespace, and the run's cgroup is
  emptied;
- with a FunctionTest (Job.check) the tests run in a checker process outside the
  sandbox, which calls into the program through pipes (upslope.sandbox.functest).
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import upslope.sandbox.cgroup as cgroup
import upslope.sandbox.seccomp as seccomp
from upslope.sandbox.functest import CHECKER_SOURCE, FD_ENV, SERVER_SOURCE, SOLUTION_NAME, Verdict, parse_verdict
from upslope.sandbox.mounts import (RunTmpfs, interpreter_args, interpreter_problem, sweep_stale_tmpfs, system_args,
                                    tmpfs_args)
from upslope.sandbox.reach import SHARED_TEMP_DIRS, others_can_run, shared_work_parent
from upslope.sandbox.supervise import count_own_processes, kill_group, kill_uid, supervise
from upslope.sandbox.types import PROGRAM_NAME, Job, Result, SandboxConfig, Status

log = logging.getLogger(__name__)

WORK_DIR = "/tmp/work"  # the program's working directory inside bubblewrap
HINT = "install bubblewrap (apt-get install -y bubblewrap), or set allow_weak=True to run with rlimits only"
_NAMESPACES_ROOT = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
_NAMESPACES_USER = ["--unshare-user", "--disable-userns", *_NAMESPACES_ROOT]
# PID 1 of the namespace: coreutils `timeout`, which runs the program, exits with its
# status, and kills it one second after the wall-clock limit even if this process is
# gone (bubblewrap arms the parent-death signal only after its setup, so a parent killed
# during the setup would otherwise leave the program running). PID 1 keeps bubblewrap's
# uid, so the parent-death signal reaches it (one aimed at the program's own uid would be
# refused: bubblewrap drops CAP_KILL); when PID 1 dies the kernel kills everything left
# in the namespace. bubblewrap waits for it, so the program's CPU time is counted. A
# plain shell stands in where `timeout` is missing.
_INIT_FALLBACK = ["/bin/sh", "-c", '"$@"; exit $?', "upslope-init"]
_UID_BLOCK = 1 << 16  # uids one Sandbox may use as root: base .. base + 65535
# Before anything of the run starts: the OOM killer's first choice, and into the run's cgroups.
_ENTER = 'echo 1000 >/proc/self/oom_score_adj || exit 125; for f; do [ "$f" = -- ] && break; echo $$ >"$f" || exit 125; shift; done; shift; exec "$@"'
_EXTRA_PIDS = 4  # bubblewrap (two), the namespace's PID 1, on top of the program's max_procs


def _is_root() -> bool:
    return os.geteuid() == 0


_said: set[str] = set()


def _say_once(line: str) -> None:
    """Warn once per process (every pool and tool makes its own Sandbox)."""
    if line not in _said:
        _said.add(line)
        log.warning(line)


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> str | None:
    """None when bubblewrap can build a sandbox here; otherwise one line saying why not."""
    tools = ["bwrap", "prlimit"] + (["setpriv"] if _is_root() else [])
    missing = [t for t in tools if shutil.which(t) is None]
    if "bwrap" in missing:
        return f"bubblewrap (bwrap) is not installed: {HINT}"
    if missing:
        return f"the sandbox needs {' and '.join(missing)} (package util-linux), not found on PATH"
    ns = _NAMESPACES_ROOT if _is_root() else _NAMESPACES_USER
    argv = ["bwrap", *ns, "--die-with-parent", *system_args(), "--proc", "/proc", "--dev", "/dev",
            *tmpfs_args(1 << 20), *interpreter_args(sys.executable), "--", "true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start: {exc}"
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        why = msg[-1] if msg else f"exit code {proc.returncode}"
        return (
            f"bubblewrap cannot create a sandbox here ({why}); unprivileged user namespaces may be "
            "disabled (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04 "
            "kernel.apparmor_restrict_unprivileged_userns=0), or run as root"
        )
    return None


def _memfd(data: str | bytes) -> int:
    fd = os.memfd_create("upslope-sandbox")
    raw = data.encode() if isinstance(data, str) else data
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Sandbox:
    """Runs untrusted programs, one per calling thread at a time (SandboxPool runs many).

    `weak=True` uses the weak mode even where bubblewrap works (for tests, or hosts where
    namespaces are unwanted); it implies allow_weak.
    """

    def __init__(self, config: SandboxConfig | None = None, *, weak: bool = False):
        self.config = config or SandboxConfig()
        self.root = _is_root()
        self._tools = {t: shutil.which(t) or t for t in ("bwrap", "prlimit", "setpriv", "timeout")}
        self.problem = "weak mode requested" if weak else bwrap_problem()
        if self.problem is None:
            self.mode = "bwrap"
        elif weak or self.config.allow_weak:
            weak_problem = self._weak_problem()
            if weak_problem:
                self.mode, self.problem = "", f"{self.problem}; and the weak mode cannot run: {weak_problem}"
            else:
                self.mode = "weak"
                if not weak:
                    log.warning("sandbox: %s; running untrusted code in the WEAK mode (rlimits only)", self.problem)
        else:
            self.mode = ""
        # As root each concurrent run gets its own uid from a random block (see uid_range).
        self._uid_base = (secrets.randbelow(0x7000) + 0x10) * _UID_BLOCK
        self._lock = threading.Lock()
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._static = self._bwrap_static_args() if self.mode == "bwrap" else []
        self._final = self._bwrap_final_args() if self.mode == "bwrap" else []
        self.cgroups, self.cgroup_problem = cgroup.available() if self.root and self.mode else (None, "not root")
        if self.root and self.mode == "bwrap":
            sweep_stale_tmpfs()
        self._seccomp = seccomp.build_filter() if self.mode == "bwrap" and seccomp.supported() else None
        if self.mode:
            why = self._interpreter_problem()
            if why:
                self.mode, self.problem = "", why
        if self.mode and self.cgroups is None:
            _say_once(f"sandbox: {self.limits_summary()}")

    def _interpreter_problem(self) -> str | None:
        """One line when a Python program cannot start here (the interpreter is missing, hidden
        or unreadable inside the sandbox), found by running one; else None."""
        python = self.config.python
        why = interpreter_problem(python) if self.mode == "bwrap" else None
        if why or not os.path.exists(python):
            return why or f"the sandbox's interpreter {python} does not exist (SandboxConfig.python)"
        res = self.run(Job(code="pass", timeout_s=max(self.config.timeout_s, 30.0)))
        if res.status in (Status.OK, Status.TIMEOUT):  # a timeout here says the host is busy, not broken
            return None
        lines = (res.error or res.stderr).strip().splitlines()
        detail = lines[-1] if lines else f"{res.status}, exit code {res.exit_code}"
        hint = ""
        if self.root and "ermission denied" in detail:
            hint = "; programs run as an unprivileged uid, so the interpreter's install must be readable by all users"
        return f"the sandbox cannot start the interpreter {python} ({detail}){hint}"

    def limits_summary(self) -> str:
        """One line: how a run's memory is limited here, in all and per process."""
        cfg = self.config
        each = f"memory_mb={cfg.memory_mb} per process (RLIMIT_AS)"
        total = cfg.run_memory_bytes >> 20
        if self.cgroups is not None:
            return f"each run is limited to {total} MiB in all by its cgroup (v{self.cgroups.version}), and to {each}"
        return (f"no per-run cgroup here ({self.cgroup_problem}): the memory limit holds {each} only; the run's "
                f"{total} MiB in all is checked every 0.1 s from its resident memory (can overshoot)")

    def _weak_problem(self) -> str | None:
        needed = ["prlimit"] + (["setpriv"] if self.root else [])
        missing = [t for t in needed if shutil.which(t) is None]
        if missing:
            return f"{' and '.join(missing)} (package util-linux) not found on PATH"
        if self.root and not others_can_run(self.config.python):
            return (
                f"as root it runs programs under an unprivileged uid, which cannot reach the interpreter "
                f"{self.config.python}; set SandboxConfig(python=...) to one outside private directories "
                "(e.g. /usr/bin/python3)"
            )
        if self.root and shared_work_parent() is None:
            return (f"as root it runs programs under an unprivileged uid, which cannot enter the temp dir "
                    f"{tempfile.gettempdir()} (TMPDIR) nor any of {', '.join(SHARED_TEMP_DIRS)} for their work directory")
        return None

    @property
    def uid_range(self) -> range | None:
        """The uids this sandbox runs programs as (when started as root), else None."""
        return range(self._uid_base, self._uid_base + _UID_BLOCK) if self.root else None

    # ---------------------------------------------------------------- command lines
    def _bwrap_static_args(self) -> list[str]:
        args = [self._tools["bwrap"], *(_NAMESPACES_ROOT if self.root else _NAMESPACES_USER)]
        args += ["--die-with-parent", "--new-session", "--as-pid-1", *system_args()]
        return args + ["--dev", "/dev", "--proc", "/proc"]

    def _bwrap_final_args(self) -> list[str]:
        """After the run's /tmp, /dev/shm and files: the interpreter (which may live below them)."""
        args = [*interpreter_args(self.config.python), "--chdir", WORK_DIR, "--remount-ro", "/", "--cap-drop", "ALL"]
        if self.root:  # setpriv inside needs these two to drop to the run's own uid
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return args

    def _limits_args(self, cpu_s: float, uid: int | None) -> list[str]:
        cfg = self.config
        nproc = cfg.max_procs
        if self.mode == "weak" and uid is None:
            nproc += count_own_processes()  # the limit is per real uid: leave room for the rest
        cpu = max(1, math.ceil(cpu_s))
        out: list[str] = []
        # The program dies with its parent (PID 1 of the namespace, or `timeout` in the weak
        # mode); a change of uid would clear that, so setpriv sets it again.
        if uid is not None:
            out += [self._tools["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
            out += ["--pdeathsig", "KILL", "--"]
        elif self.mode == "weak" and shutil.which("setpriv"):
            out += [self._tools["setpriv"], "--pdeathsig", "KILL", "--"]
        out += [
            self._tools["prlimit"],
            f"--as={cfg.memory_mb << 20}",
            f"--cpu={cpu}:{cpu + 1}",
            f"--nproc={nproc}",
            f"--nofile={cfg.max_open_files}",
            f"--fsize={cfg.disk_mb << 20}",
            "--core=0",
            "--",
        ]
        return out

    def _init_args(self, wall_s: float) -> list[str]:
        if not os.path.isabs(self._tools["timeout"]):
            return list(_INIT_FALLBACK)
        return [self._tools["timeout"], "-s", "KILL", f"{wall_s + 1:.3f}"]

    def _program_argv(self, job: Job) -> list[str]:
        if job.code is not None:
            return [self.config.python, *self.config.python_args, PROGRAM_NAME]
        return ["/bin/sh", "-c", job.command or ""]

    def _env(self, job: Job, work: str) -> dict[str, str]:
        env = {
            "PATH": f"{os.path.dirname(os.path.abspath(self.config.python))}:/usr/local/bin:/usr/bin:/bin",
            "HOME": work,
            "TMPDIR": "/tmp" if self.mode == "bwrap" else work,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        env.update(job.env)
        return env

    # ---------------------------------------------------------------- uid slots
    def _acquire_uid(self) -> int | None:
        if not self.root:
            return None
        with self._lock:
            if self._free_slots:
                slot = self._free_slots.pop()
            else:
                if self._next_slot >= _UID_BLOCK:
                    raise RuntimeError("sandbox: more than 65536 concurrent runs")
                slot, self._next_slot = self._next_slot, self._next_slot + 1
        return self._uid_base + slot

    def _release_uid(self, uid: int | None) -> None:
        if uid is not None:
            with self._lock:
                self._free_slots.append(uid - self._uid_base)

    # ---------------------------------------------------------------- running
    def run(self, job: Job, deadline: float | None = None) -> Result:
        """Run `job` to completion (or to a limit: its own, or the batch's `deadline`, a
        time.monotonic() value) and return how it ended. Never raises for anything the
        program does."""
        if not self.mode:
            return Result(Status.REFUSED, error=self.problem or "sandbox unavailable")
        wall, cpu = self._timeouts(job)
        if deadline is not None:
            wall = min(wall, deadline - time.monotonic())
            if wall <= 0:
                return Result(Status.TIMEOUT, error="the batch's deadline passed before this job started", mode=self.mode)
        uid = self._acquire_uid()
        group = None
        try:
            if self.cgroups is not None:
                try:
                    group = self.cgroups.new_run(self.config.run_memory_bytes, self.config.max_procs + _EXTRA_PIDS)
                except OSError as exc:
                    log.warning("sandbox: no cgroup for this run (%s); limiting by rlimits and summed RSS", exc)
            run = self._run_bwrap if self.mode == "bwrap" else self._run_weak
            res = run(job, uid, wall, cpu, group)
            if group is not None and group.oom_killed() and res.status is not Status.OK:
                res.status = Status.MEMORY
            res.limits = f"cgroup v{group.version}" if group is not None else "rlimit"
            return res
        finally:
            if group is not None:
                group.remove()
            self._release_uid(uid)

    def _timeouts(self, job: Job) -> tuple[float, float]:
        wall = job.timeout_s if job.timeout_s is not None else self.config.timeout_s
        cpu = self.config.cpu_s if self.config.cpu_s is not None else wall
        return wall, cpu

    def _files(self, job: Job) -> dict[str, str | bytes]:
        files = dict(job.files)
        if job.check is not None:
            files[SOLUTION_NAME] = job.code or ""
            files[PROGRAM_NAME] = SERVER_SOURCE
        elif job.code is not None:
            files[PROGRAM_NAME] = job.code
        return files

    def _enter_args(self, group: cgroup.RunGroup | None) -> list[str]:
        return ["/bin/sh", "-c", _ENTER, "upslope-enter", *(group.procs_files if group else []), "--"]

    def _poll(self, group: cgroup.RunGroup | None, pid: int):
        """What the supervisor checks every 0.1 s: the run's processes keep oom_score_adj 1000
        (a program may lower its own), and without a cgroup, the run's summed resident memory."""
        limit = self.config.run_memory_bytes

        def poll() -> Status | None:
            pids = group.pids() if group is not None else cgroup.tree_pids(pid)
            cgroup.raise_oom_score(pids)
            if group is None and cgroup.rss_bytes(pids) > limit:
                return Status.MEMORY
            return None

        return poll

    def _run_bwrap(self, job: Job, uid: int | None, wall: float, cpu: float, group: cgroup.RunGroup | None) -> Result:
        fds: list[int] = []
        tmp: RunTmpfs | None = None
        checker: _Checker | None = None
        try:
            if self.root:
                tmp = RunTmpfs(self.config.disk_mb << 20, self.config.max_inodes)
                file_args = tmp.bwrap_args()
            else:
                file_args = tmpfs_args(self.config.disk_mb << 20)
            file_args += ["--perms", "0777", "--dir", WORK_DIR]  # before the files, which would make it 0755
            dirs: set[str] = set()
            for name, content in self._files(job).items():
                for i in range(1, name.count("/") + 1):
                    sub = "/".join(name.split("/")[:i])
                    if sub not in dirs:
                        dirs.add(sub)
                        file_args += ["--perms", "0777", "--dir", f"{WORK_DIR}/{sub}"]
                fd = _memfd(content)
                fds.append(fd)
                file_args += ["--perms", "0666", "--file", str(fd), f"{WORK_DIR}/{name}"]
            if self._seccomp is not None:
                fd = _memfd(self._seccomp)
                fds.append(fd)
                file_args += ["--seccomp", str(fd)]
            status_r, status_w = os.pipe()
            fds += [status_r, status_w]
            env = self._env(job, WORK_DIR)
            if job.check is not None:
                checker = _Checker(job, wall, self.config.max_output_bytes, self.config.memory_mb << 20)
                env[FD_ENV] = checker.env_value
            argv = [
                *self._enter_args(group),
                *self._static,
                *file_args,
                *self._final,
                "--json-status-fd",
                str(status_w),
                "--",
                *self._init_args(wall),
                *self._limits_args(cpu, uid),
                *self._program_argv(job),
            ]
            stdin = _memfd(job.stdin) if job.stdin is not None else subprocess.DEVNULL
            if isinstance(stdin, int) and stdin >= 0:
                fds.append(stdin)
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd="/",
                pass_fds=[f for f in fds if f not in (status_r, stdin)] + (checker.sandbox_fds if checker else []),
                start_new_session=True,
            )
            os.close(status_w)
            fds.remove(status_w)
            if checker is not None:
                checker.close_sandbox_side()
            try:
                res = supervise(
                    proc, wall, self.config.max_output_bytes, status_fd=status_r,
                    kill_extra=group.kill_all if group else None, poll=self._poll(group, proc.pid),
                )
            except BaseException:
                kill_group(proc.pid)
                raise
        except OSError as exc:
            return Result(Status.REFUSED, error=f"could not start the sandbox: {exc}", mode="bwrap")
        finally:
            try:
                for fd in fds:
                    os.close(fd)
                if group is not None:
                    group.kill_all()
            finally:
                if tmp is not None:
                    tmp.remove()
                verdict = checker.finish() if checker is not None else None
        res.mode = "bwrap"
        if b'"child-pid"' not in res.status_json and res.killed_for is None:
            err = res.stderr.strip().splitlines()
            return Result(Status.REFUSED, error="bubblewrap failed: " + (err[-1] if err else "no detail"), mode="bwrap")
        out = res.finish(cpu, exit_signals_as_codes=True)
        out.verdict = verdict
        return out

    def _run_weak(self, job: Job, uid: int | None, wall: float, cpu: float, group: cgroup.RunGroup | None) -> Result:
        # the run's own uid must enter it: a shared temp dir when TMPDIR is private
        work = tempfile.mkdtemp(prefix="upslope-sandbox-", dir=shared_work_parent() if uid is not None else None)
        fds: list[int] = []
        checker: _Checker | None = None
        try:
            for name, content in self._files(job).items():
                path = os.path.join(work, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(content.encode() if isinstance(content, str) else content)
            if uid is not None:
                for dirpath, dirnames, filenames in os.walk(work):
                    for n in [dirpath, *(os.path.join(dirpath, x) for x in dirnames + filenames)]:
                        os.chown(n, uid, uid)
            stdin = subprocess.DEVNULL
            if job.stdin is not None:
                stdin = _memfd(job.stdin)
                fds.append(stdin)
            env = self._env(job, work)
            if job.check is not None:
                checker = _Checker(job, wall, self.config.max_output_bytes, self.config.memory_mb << 20)
                env[FD_ENV] = checker.env_value
            # `timeout` bounds the run even if this process dies before it can kill it
            backstop = self._init_args(wall) if os.path.isabs(self._tools["timeout"]) else []
            argv = [*self._enter_args(group), *backstop, *self._limits_args(cpu, uid), *self._program_argv(job)]
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=work,
                pass_fds=checker.sandbox_fds if checker else (),
                start_new_session=True,
            )
            if checker is not None:
                checker.close_sandbox_side()

            def sweep() -> None:  # as root: every process of the run's own uid and cgroup
                if uid is not None:
                    kill_uid(uid)
                if group is not None:
                    group.kill_all()

            try:
                res = supervise(proc, wall, self.config.max_output_bytes, kill_extra=sweep,
                                poll=self._poll(group, proc.pid))
            finally:
                kill_group(proc.pid)  # leftovers that outlived the program
                sweep()
        except OSError as exc:
            return Result(Status.REFUSED, error=f"could not start the sandbox: {exc}", mode="weak")
        finally:
            for fd in fds:
                os.close(fd)
            shutil.rmtree(work, ignore_errors=True)
            verdict = checker.finish() if checker is not None else None
        res.mode = "weak"
        out = res.finish(cpu, exit_signals_as_codes=False)
        out.verdict = verdict
        return out


class _CheckerProcess:
    """A checker process kept alive for one thread: it judges one test after another, each
    handed over on a unix socket with the two pipe ends of its run (saves an interpreter
    start per test). Replaced after a test that outlives its deadline."""

    _local = threading.local()

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", CHECKER_SOURCE, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True, cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
        finally:
            theirs.close()
        self.sock = ours
        self.pid = os.getpid()

    @classmethod
    def for_this_thread(cls) -> _CheckerProcess:
        cur = getattr(cls._local, "checker", None)
        if cur is None or cur.pid != os.getpid() or cur.proc.poll() is not None:
            cur = cls._local.checker = cls()
        return cur

    def discard(self) -> None:
        kill_group(self.proc.pid)
        self.proc.wait()
        self.sock.close()
        if getattr(self._local, "checker", None) is self:
            self._local.checker = None


class _Checker:
    """The checker's side of one function test: outside the sandbox, talking to it over two pipes."""

    def __init__(self, job: Job, wall: float, cap: int, memory: int):
        check = job.check
        assert check is not None
        spec = json.dumps({"prefix": check.prefix, "test": check.test, "entry_point": check.entry_point,
                           "timeout_s": wall, "cap": cap, "memory": memory}).encode()
        if len(spec) > (1 << 24) - 64:
            raise OSError("the function test is larger than 16 MiB")
        req_r, req_w = os.pipe()  # checker -> sandbox: calls
        resp_r, resp_w = os.pipe()  # sandbox -> checker: replies
        self.sandbox_fds = [req_r, resp_w]
        self.env_value = f"{req_r},{resp_w}"
        self.deadline = time.monotonic() + wall + 2.0
        try:
            self.checker = _CheckerProcess.for_this_thread()
            socket.send_fds(self.checker.sock, [spec], [resp_r, req_w])
        except OSError:
            self.close_sandbox_side()
            raise
        finally:
            os.close(resp_r)
            os.close(req_w)

    def close_sandbox_side(self) -> None:
        """After the sandbox started (or failed to): drop this process's copies of its ends,
        so that each side sees the other's EOF."""
        for fd in self.sandbox_fds:
            os.close(fd)
        self.sandbox_fds = []

    def finish(self) -> Verdict:
        """Wait for the verdict (replacing a checker that outlives its deadline) and parse it."""
        self.close_sandbox_side()
        sock = self.checker.sock
        sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        try:
            raw = sock.recv(1 << 16)
        except (socket.timeout, OSError):
            self.checker.discard()
            return Verdict(False, "timeout", "the tests did not finish in time")
        if not raw:  # the checker died (the test code called os._exit, or it was killed)
            self.checker.discard()
        return parse_verdict(raw)
