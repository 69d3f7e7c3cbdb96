"""Watching one running program: read its output as it comes, enforce the wall clock and
the output cap, kill what must die, reap it with its resource usage, and classify how it
ended."""
from __future__ import annotations

import errno
import logging
import math
import os
import re
import selectors
import signal
import subprocess
import time
from typing import Callable

from upslope.sandbox.types import Result, Status

log = logging.getLogger(__name__)

_GRACE_S = 0.5  # after the program exits, how long leftover holders of its pipes may linger
_OOM = re.compile(r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory", re.IGNORECASE)


class Run:
    """What the supervisor saw; `finish` turns it into a Result."""

    def __init__(self) -> None:
        self.stdout = self.stderr = ""
        self.truncated = False
        self.killed_for: Status | None = None
        self.wait_status = 0
        self.wall_s = self.cpu_s = 0.0
        self.mode = ""
        self.status_json = b""

    def finish(self, cpu_limit: float, exit_signals_as_codes: bool) -> Result:
        code: int | None = None
        sig: int | None = None
        if os.WIFSIGNALED(self.wait_status):
            sig = os.WTERMSIG(self.wait_status)
        else:
            code = os.WEXITSTATUS(self.wait_status)
            # bubblewrap reports a program killed by signal N as exit code 128 + N
            if exit_signals_as_codes and 128 < code < 128 + signal.NSIG:
                code, sig = None, code - 128
        tail = "\n".join(self.stderr[-4000:].strip().splitlines()[-3:])
        if self.killed_for is not None:
            status = self.killed_for
        elif sig is not None:
            hit_cpu = sig == signal.SIGXCPU or (sig == signal.SIGKILL and self.cpu_s >= math.ceil(cpu_limit) - 0.05)
            status = Status.TIMEOUT if hit_cpu else Status.MEMORY if _OOM.search(tail) else Status.CRASHED
        elif code == 0:
            status = Status.OK
        else:
            status = Status.MEMORY if _OOM.search(tail) else Status.FAILED
        return Result(
            status=status,
            exit_code=code,
            signal=sig,
            stdout=self.stdout,
            stderr=self.stderr,
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            truncated=self.truncated,
            mode=self.mode,
        )


def supervise(
    proc: subprocess.Popen,
    wall_s: float,
    cap: int,
    status_fd: int | None = None,
    kill_extra: Callable[[], None] | None = None,
    poll: Callable[[], Status | None] | None = None,
) -> Run:
    """Read the program's output as it comes, kill it at the deadline or past the output
    cap, and reap it with its resource usage.

    With bubblewrap (`status_fd` is its --json-status-fd), a kill goes first to the
    children of the namespace's PID 1 (the program), so that PID 1 reaps it and its CPU
    time is still counted, then PID 1 exits and the kernel kills the rest of the
    namespace; if bubblewrap has not exited a second later, its process group is killed.
    `poll`, called every 0.1 s, returns a status to kill the run for (e.g. its summed memory).
    """
    run = Run()
    start = time.monotonic()
    deadline = start + wall_s
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if status_fd is not None:
        os.set_blocking(status_fd, False)
        sel.register(status_fd, selectors.EVENT_READ)
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = -1
    open_fds = set(bufs)
    child_pid: int | None = None
    exited_at: float | None = None
    killed_at: float | None = None
    escalated = False
    next_poll = start + 0.1

    def kill(reason: Status | None) -> None:
        nonlocal killed_at, escalated
        if killed_at is None:
            killed_at = time.monotonic()
            run.killed_for = reason
            if child_pid is not None:  # the program (and orphans) under the namespace's PID 1
                for pid in _children(child_pid) or [child_pid]:
                    _kill_pid(pid)
            else:
                kill_group(proc.pid)
                escalated = True
        else:
            kill_group(proc.pid)
            escalated = True
        if kill_extra is not None:
            kill_extra()

    try:
        while open_fds or exited_at is None:
            now = time.monotonic()
            if exited_at is None and pidfd < 0 and _has_exited(proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > _GRACE_S:
                break  # something that outlived the program still holds its pipes
            if poll is not None and killed_at is None and now >= next_poll:
                next_poll = now + 0.1
                reason = poll()
                if reason is not None:
                    kill(reason)
            if killed_at is None and now >= deadline:
                kill(Status.TIMEOUT)
            elif killed_at is not None and exited_at is None and not escalated and now - killed_at > 1.0:
                kill(None)
            elif killed_at is not None and now - killed_at > 10.0:
                break
            limit = (deadline - now) if killed_at is None else 0.1
            if exited_at is not None:
                limit = min(limit, exited_at + _GRACE_S - now)
            if pidfd < 0:
                limit = min(limit, 0.05)
            if poll is not None:
                limit = min(limit, max(0.0, next_poll - now))
            for key, _ in sel.select(timeout=max(0.0, limit)):
                fd = key.fd
                if fd == pidfd:
                    sel.unregister(pidfd)
                    exited_at = time.monotonic()
                    continue
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if fd == status_fd:
                    run.status_json += chunk
                    if not chunk:
                        sel.unregister(fd)
                    elif child_pid is None:
                        m = re.search(rb'"child-pid": *(\d+)', run.status_json)
                        child_pid = int(m.group(1)) if m else None
                    continue
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                buf = bufs[fd]
                room = cap - len(buf)
                buf += chunk[: max(0, room)]
                if len(chunk) > room:
                    run.truncated = True
                    if killed_at is None:
                        kill(Status.OUTPUT_LIMIT)
    finally:
        sel.close()
        if pidfd >= 0:
            os.close(pidfd)
    if exited_at is None:
        kill(run.killed_for)
        kill(run.killed_for)
    _, status, usage = _wait4(proc)
    run.wall_s = time.monotonic() - start
    if status_fd is not None:
        run.status_json += _read_available(status_fd)
    run.wait_status = status
    run.cpu_s = usage.ru_utime + usage.ru_stime
    run.stdout = bufs[out_fd].decode("utf-8", "replace")
    run.stderr = bufs[err_fd].decode("utf-8", "replace")
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    return run


def _wait4(proc: subprocess.Popen):
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, 0)
        except InterruptedError:
            continue
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait again
        return pid, status, usage


def _has_exited(pid: int) -> bool:
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    out = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pids_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes running as `uid`."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and not _is_zombie(entry.name):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _is_zombie(pid: str) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")


def kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid` (a uid this sandbox owns), until none is left."""
    for _ in range(200):
        pids = pids_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                if exc.errno not in (errno.ESRCH, errno.EPERM):
                    raise
        time.sleep(0.005)
    log.warning("sandbox: processes of uid %d survived 200 kill rounds", uid)


def count_own_processes() -> int:
    return len(pids_of_uid(os.getuid()))
