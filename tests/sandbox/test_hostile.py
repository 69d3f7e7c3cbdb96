"""Hostile programs: each must be contained, end with the right status, and leave the host as it was."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import textwrap
import threading
import time

import pytest
from hermetic import ROOT
from sandbox_helpers import needs_bwrap, pids_with_marker, pids_with_uid_in

from upslope.sandbox import Job, SandboxConfig, SandboxPool, Status

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """Files of the parent's that the programs go after, and their fingerprint before."""
    base = tmp_path_factory.mktemp("host")
    canary = base / "canary.txt"
    canary.write_text("the parent's data\n")
    home = os.path.expanduser("~")
    targets = {
        "canary": str(canary),
        "new_in_tmp": str(base / "created_by_sandbox.txt"),
        "home": os.path.join(home, f".upslope_sandbox_probe_{os.getpid()}"),
        "repo": str(ROOT / f".upslope_sandbox_probe_{os.getpid()}"),
        "etc": f"/etc/upslope_sandbox_probe_{os.getpid()}",
    }
    before = hashlib.sha256(canary.read_bytes()).hexdigest()
    yield targets
    assert hashlib.sha256(canary.read_bytes()).hexdigest() == before
    for key in ("new_in_tmp", "home", "repo", "etc"):
        assert not os.path.exists(targets[key]), f"the sandbox created {targets[key]} on the host"


@pytest.fixture(scope="module")
def hpool(host):
    p = SandboxPool(SandboxConfig(timeout_s=3.0, memory_mb=256, max_output_bytes=1 << 20))
    yield p
    p.close()
    time.sleep(0.1)
    assert pids_with_uid_in(p.sandbox.uid_range) == [], "a sandboxed process outlived the suite"


def test_network_is_unreachable(hpool):
    """A listener on the host's 127.0.0.1 gets no connection; no route leaves the sandbox."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept_loop(stop):
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    stop = threading.Event()
    t = threading.Thread(target=accept_loop, args=(stop,))
    t.start()
    try:
        code = textwrap.dedent(f"""
            import socket, sys
            errors = []
            for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
                try:
                    socket.create_connection(addr, timeout=1).close()
                    print("CONNECTED", addr)
                except OSError as exc:
                    errors.append(type(exc).__name__)
            print(errors)
            sys.exit(1 if len(errors) == 3 else 0)
        """)
        res = hpool.run(Job(code=code))
    finally:
        stop.set()
        t.join()
        server.close()
    assert res.status is Status.FAILED, res.stdout + res.stderr
    assert "CONNECTED" not in res.stdout and accepted == []


def test_writes_outside_the_work_directory_fail(hpool, host):
    code = textwrap.dedent(f"""
        import os
        results = {{}}
        for name, path in {host!r}.items():
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                results[name] = "written"
            except OSError as exc:
                results[name] = type(exc).__name__
        open("allowed.txt", "w").write("fine")  # the work directory is writable
        print(results)
        raise SystemExit(0 if all(v != "written" or k == "new_in_tmp" for k, v in results.items()) else 3)
    """)
    res = hpool.run(Job(code=code))
    # /tmp inside is the sandbox's own: a write there lands in it, never on the host
    assert res.status is Status.OK, res.stdout + res.stderr


def test_environment_secret_is_not_visible(hpool, monkeypatch):
    secret = f"upslope-secret-{os.getpid()}-{time.time_ns()}"
    monkeypatch.setenv("UPSLOPE_TEST_SECRET", secret)
    code = textwrap.dedent("""
        import os, glob
        print(dict(os.environ))
        for path in glob.glob("/proc/*/environ"):
            try:
                print(open(path, "rb").read())
            except OSError:
                pass
    """)
    res = hpool.run(Job(code=code))
    assert res.status is Status.OK
    assert "UPSLOPE_TEST_SECRET" not in res.stdout and secret not in res.stdout + res.stderr


def test_fork_bomb_is_contained(hpool):
    bomb = textwrap.dedent("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)
    res = hpool.run(Job(code=bomb, timeout_s=2))
    assert res.status is Status.TIMEOUT and res.wall_s < 10
    # the host still forks at once
    t = time.monotonic()
    assert subprocess.run(["true"]).returncode == 0 and time.monotonic() - t < 2


def test_memory_bomb(hpool):
    res = hpool.run(Job(code="blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))", timeout_s=10))
    assert res.status is Status.MEMORY, res.stderr[-500:]


def test_infinite_loop(hpool):
    t = time.monotonic()
    res = hpool.run(Job(code="while True:\n    pass", timeout_s=1))
    assert res.status is Status.TIMEOUT and time.monotonic() - t < 4


def test_program_ignoring_sigterm(hpool):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)"
    res = hpool.run(Job(code=code, timeout_s=1))
    assert res.status is Status.TIMEOUT and res.wall_s < 4


def test_printing_gigabytes(hpool):
    t = time.monotonic()
    res = hpool.run(Job(code="import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.stdout.write(chunk)"))
    assert res.status is Status.OUTPUT_LIMIT and res.truncated
    assert len(res.stdout) == hpool.config.max_output_bytes and time.monotonic() - t < 5


def test_printing_gigabytes_to_stderr(hpool):
    res = hpool.run(Job(code="import os\nwhile True:\n    os.write(2, b'e' * 65536)"))
    assert res.status is Status.OUTPUT_LIMIT and len(res.stderr) == hpool.config.max_output_bytes


def test_deep_recursion(hpool):
    # the interpreter's own guard: a RecursionError, an ordinary failure
    res = hpool.run(Job(code="def f(n):\n    return f(n + 1)\nf(0)"))
    assert res.status is Status.FAILED and "RecursionError" in res.stderr
    # with the guard lifted, recursion through C overflows the stack: SIGSEGV
    code = "import sys\nsys.setrecursionlimit(10**8)\nx = []\nfor _ in range(10**6):\n    x = [x]\nprint(repr(x))"
    res = hpool.run(Job(code=code, timeout_s=30))
    assert res.status is Status.CRASHED and res.signal == 11, (res.status, res.stderr[-300:])


def test_detached_child_does_not_outlive_the_sandbox(hpool):
    marker = f"upslope-escape-{os.getpid()}-{time.time_ns()}"
    code = textwrap.dedent(f"""
        import os, subprocess
        subprocess.Popen(["setsid", "sh", "-c", "sleep 300; : {marker}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        if os.fork() == 0:  # a classic daemon: fork, setsid, fork
            os.setsid()
            if os.fork() == 0:
                os.execvp("sh", ["sh", "-c", "sleep 300; : {marker}"])
            os._exit(0)
        print("left children behind")
    """)
    res = hpool.run(Job(code=code))
    assert res.status is Status.OK and res.wall_s < 10
    for _ in range(40):
        if not pids_with_marker(marker):
            break
        time.sleep(0.05)
    assert pids_with_marker(marker) == []


def test_cannot_see_or_signal_host_processes(hpool):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        code = textwrap.dedent(f"""
            import os
            print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
            try:
                os.kill({victim.pid}, 9)
                print("KILLED")
            except OSError as exc:
                print(type(exc).__name__)
        """)
        res = hpool.run(Job(code=code))
        assert res.status is Status.OK and "KILLED" not in res.stdout
        assert max(eval(res.stdout.splitlines()[0])) < 10  # its own PID namespace
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_namespace_mount_and_ptrace_calls_are_refused(hpool):
    """The seccomp filter: no new namespaces, mounts or ptrace; ordinary process and thread
    creation (fork, threads, subprocess, multiprocessing) still work."""
    from upslope.sandbox import seccomp

    if not seccomp.supported():
        pytest.skip("no seccomp table for this architecture")
    code = textwrap.dedent("""
        import ctypes, errno, multiprocessing, os, subprocess, threading
        libc = ctypes.CDLL(None, use_errno=True)
        def err(ret):
            return "ok" if ret == 0 else errno.errorcode[ctypes.get_errno()]
        print(err(libc.unshare(0x10000000)), err(libc.unshare(0x40000000)))
        print(err(libc.mount(b"none", b"/tmp/work", b"tmpfs", 0, None)), err(libc.ptrace(16, 1, 0, 0)))
        t = threading.Thread(target=print, args=("thread",))
        t.start()
        t.join()
        print(subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
        with multiprocessing.Pool(2) as pool:
            print(sum(pool.map(abs, [-1, -2, -3])))
    """)
    res = hpool.run(Job(code=code))
    assert res.status is Status.OK, res.stderr[-1000:]
    assert res.stdout.split("\n")[:5] == ["EPERM EPERM", "EPERM EPERM", "thread", "child", "6"]
