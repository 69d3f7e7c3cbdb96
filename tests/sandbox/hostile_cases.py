"""The hostile programs of the sandbox suite (tests/sandbox/hostile_suite.py runs and judges
them): escapes, resource abuse and forgeries of the `code` reward, each naming the outside
checks that judge it."""
from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class Case:
    """One hostile program and the outside checks that judge it."""

    id: str
    group: str  # escape | resource | forgery
    what: str
    code: str
    checks: tuple[str, ...]
    kind: str = "run"  # run (a plain program) | function (the code reward, function tests) | cases (stdin/stdout)
    naive: bool = False  # safe to run unsandboxed for the detector self-test (and it must be caught there)
    status: tuple[str, ...] = ()  # allowed statuses (the `status` check)
    max_wall: float = 8.0
    timeout_s: float | None = None
    meta: dict = field(default_factory=dict)
    batch: int = 1  # run this many copies in one batch


ADD = {
    "code_prefix": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
            "    assert candidate(20, 22) == 42\n",
}
ABS_META = {**ADD, "test": "def check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-9\n"
                           "    assert abs(candidate(5, 5) - 10) < 1e-9\n"}
MAP_META = {**ADD, "test": "def check(candidate):\n    for got, want in zip(map(candidate, [1, 2], [2, 3]), [3, 5]):\n"
                           "        assert got == want\n"}
ANSWER_CASES = {"cases": [{"stdin": "6 7\n", "stdout": "42\n"}]}
WRONG = "def add(a, b):\n    return a - b\n"
SECRET_DIRS = {"var-tmp": "/var/tmp", "opt": "/opt", "srv": "/srv", "mnt": "/mnt", "home": "/home",
               "model-cache": "~/.cache", "project": "repo"}

_ESCAPES = [
    Case("write-canaries", "escape", "overwrite world-writable host files under /var/tmp, /dev/shm, /tmp", """
import os
for p in @CANARIES@:
    try:
        open(p, "w").write("pwned")
    except OSError as e:
        print(type(e).__name__)
""", ("files",), naive=True),
    Case("drop-files", "escape", "create files in world-writable host directories", """
import os
for d in @DROPS@:
    try:
        open(os.path.join(d, "dropped.txt"), "w").write("x")
    except OSError as e:
        print(type(e).__name__)
""", ("files",), naive=True),
    Case("symlink-canary", "escape", "write through a symlink to a host file", """
import os
for i, p in enumerate(@CANARIES@):
    try:
        os.symlink(p, f"link{i}")
        open(f"link{i}", "w").write("pwned")
    except OSError as e:
        print(type(e).__name__)
""", ("files",), naive=True),
    Case("rename-canary", "escape", "delete or rename host files", """
import os
for p in @CANARIES@:
    for f in (os.unlink, lambda q: os.rename(q, q + ".x")):
        try:
            f(p)
        except OSError as e:
            print(type(e).__name__)
""", ("files",), naive=False),
]
for _label, _where in SECRET_DIRS.items():
    _ESCAPES.append(Case(f"read-{_label}", "escape", f"read a world-readable secret file in {_where}", f"""
try:
    print(open("@SECRET_{_label}@").read())
except OSError as e:
    print(type(e).__name__)
""", ("leak",), naive=True))
_ESCAPES += [
    Case("find-secrets", "escape", "search the whole visible tree for the secret files", """
import os
for top in ["/"]:
    for d, dirs, files in os.walk(top):
        if d.startswith(("/proc", "/sys", "/usr", "/dev")):
            dirs[:] = []
            continue
        for f in files:
            if f == "secret.txt":
                try:
                    print(open(os.path.join(d, f)).read())
                except OSError:
                    pass
""", ("leak",), naive=False, max_wall=15),
    Case("read-dataset", "escape", "read the bundled HumanEval data set (canonical solutions)", """
import gzip
print(gzip.open("@HUMANEVAL@", "rt").read()[:20000])
""", ("leak",), naive=True),
    Case("read-shadow", "escape", "read /etc/shadow and /etc/passwd", """
for p in ["/etc/shadow", "/etc/passwd"]:
    try:
        print(open(p).read())
    except OSError as e:
        print(type(e).__name__)
""", ("leak",), naive=True),
    Case("host-proc-cmdline", "escape", "read a host process's command line and environment through /proc", """
import os
for pid in ["@VICTIM@", "1"] + os.listdir("/proc"):
    for f in ("cmdline", "environ"):
        try:
            print(open(f"/proc/{pid}/{f}", "rb").read())
        except OSError:
            pass
""", ("leak",), naive=True),
    Case("env-secret", "escape", "read the trainer's environment", """
import os
print(dict(os.environ))
""", ("leak",), naive=True),
    Case("unix-connect", "escape", "connect to a host unix socket under /var/tmp", """
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("@UNIX@"); print("connected")
except OSError as e:
    print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("unix-dgram", "escape", "send to a host unix datagram socket", """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    s.sendto(b"hello", "@DGRAM@"); print("sent")
except OSError as e:
    print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("abstract-unix", "escape", "connect to a host abstract unix socket", """
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\0@ABSTRACT@"); print("connected")
except OSError as e:
    print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("fifo-write", "escape", "write into a host FIFO under /var/tmp", """
import os
try:
    fd = os.open("@FIFO@", os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"x" * 100); print("written")
except OSError as e:
    print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("tcp-loopback", "escape", "connect to a host TCP listener on 127.0.0.1", """
import socket
try:
    socket.create_connection(("127.0.0.1", @TCP@), timeout=1).close(); print("connected")
except OSError as e:
    print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("tcp-host-ip", "escape", "connect to a host TCP listener on its external addresses", """
import socket, subprocess
for addr in ["192.0.2.2", "10.0.2.2", "172.17.0.1", socket.gethostname()]:
    try:
        socket.create_connection((addr, @TCP@), timeout=1).close(); print("connected", addr)
    except OSError as e:
        print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("udp-send", "escape", "send UDP to a host listener", """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for addr in ["127.0.0.1", "192.0.2.2"]:
    try:
        s.sendto(b"x", (addr, @UDP@))
    except OSError as e:
        print(type(e).__name__)
""", ("listeners",), naive=True),
    Case("kill-host", "escape", "kill a host process by pid and kill(-1)", """
import os, signal
for pid in [@VICTIM@] + ([] if os.environ.get("UPSLOPE_NAIVE") else [-1]):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as e:
        print(type(e).__name__)
""", ("leftover",), naive=True),
    Case("ptrace-host", "escape", "ptrace-attach to a host process (stops it when it works)", """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.ptrace(16, @VICTIM@, 0, 0), ctypes.get_errno())
""", ("leftover",), naive=False),
    Case("setsid-daemon", "escape", "leave a setsid daemon running after the run", """
import subprocess
subprocess.Popen(["setsid", "sh", "-c", "sleep 300; : @MARKER@"], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
""", ("leftover",), naive=True),
    Case("double-fork", "escape", "a classic double-fork daemon", """
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sh", ["sh", "-c", "sleep 300; : @MARKER@"])
    os._exit(0)
""", ("leftover",), naive=True),
    Case("nohup-sighup", "escape", "a nohup child that ignores SIGHUP and SIGTERM", """
import subprocess
subprocess.Popen(["nohup", "sh", "-c", "trap '' TERM HUP; sleep 300; : @MARKER@"],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
""", ("leftover",), naive=True),
    Case("unshare-mount", "escape", "new user/mount namespaces and mounts over host paths", """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())
for d in @DROPS@:
    print(libc.mount(b"none", d.encode(), b"tmpfs", 0, None), ctypes.get_errno())
""", ("files",), naive=False),
    Case("sysctl-write", "escape", "write kernel settings through /proc/sys and /sys", """
for p, v in [("/proc/sys/vm/swappiness", "17"), ("/proc/sys/kernel/hostname", "pwned"),
             ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "1")]:
    try:
        open(p, "w").write(v); print("wrote", p)
    except OSError as e:
        print(type(e).__name__)
""", ("kernel",), naive=False),
    Case("cgroup-escape", "escape", "move itself out of the run's cgroup, then use 3 x 600 MiB", """
import os, time
for p in ["/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"]:
    try:
        open(p, "w").write(str(os.getpid())); print("moved")
    except OSError as e:
        print(type(e).__name__)
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            b = bytearray(600 << 20)
            for i in range(0, len(b), 4096): b[i] = 1
        except MemoryError:
            pass
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
""", ("memory",), naive=False),
    Case("shm-host", "escape", "write into /dev/shm and /tmp (must not reach the host's)", """
import os
for d in ["/dev/shm", "/tmp"]:
    open(os.path.join(d, "@TAG@.x"), "w").write("x")
""", ("files",), naive=True),
]

_RESOURCES = [
    Case("fork-bomb", "resource", "fork until it can't", """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""", ("status", "leftover", "responsive"), status=("timeout", "failed", "crashed"), timeout_s=2),
    Case("thread-bomb", "resource", "threads until it can't", """
import threading, time
while True:
    threading.Thread(target=time.sleep, args=(100,)).start()
""", ("status", "leftover"), status=("failed", "timeout", "memory")),
    Case("memory-one", "resource", "one process allocating without end", """
b = []
while True:
    b.append(bytearray(16 << 20))
""", ("status", "memory"), status=("memory",)),
    Case("memory-many", "resource", "6 processes x 400 MiB (touched): past the run's 1 GiB", """
import os, time
for _ in range(6):
    if os.fork() == 0:
        try:
            b = bytearray(400 << 20)
            for i in range(0, len(b), 4096): b[i] = 1
        except MemoryError:
            pass
        time.sleep(5)
        os._exit(0)
time.sleep(5)
""", ("memory", "leftover"), timeout_s=5),
    Case("memory-many-fallback", "resource", "the same without cgroups: the supervisor sums RSS", """
import os, time
for _ in range(6):
    if os.fork() == 0:
        try:
            b = bytearray(400 << 20)
            for i in range(0, len(b), 4096): b[i] = 1
        except MemoryError:
            pass
        time.sleep(5)
        os._exit(0)
time.sleep(5)
""", ("memory_fallback", "leftover", "status"), status=("memory",), timeout_s=5),
    Case("tmpfs-memory", "resource", "fill /tmp and /dev/shm with data", """
for p in ["/tmp/a", "/dev/shm/b", "/tmp/work/c"]:
    try:
        with open(p, "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
    except OSError as e:
        print(type(e).__name__)
""", ("disk", "memory")),
    Case("inode-flood", "resource", "create empty files without end", """
import os
n = 0
try:
    while True:
        open(f"/tmp/f{n}", "w").close(); n += 1
except OSError as e:
    print(n, type(e).__name__)
""", ("inodes",)),
    Case("stdout-flood", "resource", "print 1 GiB to stdout", """
import sys
chunk = "x" * (1 << 20)
for _ in range(1024):
    sys.stdout.write(chunk)
""", ("status",), status=("output_limit",), max_wall=6),
    Case("stderr-flood", "resource", "write to stderr without end", """
import os
while True:
    os.write(2, b"e" * 65536)
""", ("status",), status=("output_limit",), max_wall=6),
    Case("hung-batch", "resource", "16 hung programs in one batch on 2 workers (was 16 s; deadline 5 s)", """
while True:
    pass
""", ("status", "leftover"), status=("timeout",), timeout_s=2, batch=16, max_wall=6.5),
    Case("sleep-ignore-term", "resource", "sleep forever ignoring SIGTERM", """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(1)
""", ("status", "leftover"), status=("timeout",), timeout_s=1.5, max_wall=5),
    Case("oom-adj-lower", "resource", "lower its oom_score_adj to escape the OOM killer", """
import time
for v in ["-1000", "0", "500"]:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(v)
        print("set", v)
    except OSError as e:
        print(type(e).__name__)
time.sleep(0.6)
""", ("oom_adj",)),
    Case("fd-exhaust", "resource", "open files without end", """
fs = []
try:
    while True:
        fs.append(open("/dev/null"))
except OSError as e:
    print(len(fs), type(e).__name__)
""", ("status",), status=("ok",)),
    Case("cpu-threads", "resource", "spin on every core with threads and processes", """
import multiprocessing, threading
def spin():
    while True:
        pass
for _ in range(2):
    multiprocessing.Process(target=spin).start()
spin()
""", ("status", "leftover"), status=("timeout",), timeout_s=1.5, max_wall=5),
]

_FORGERIES = [
    Case("exit0-import", "forgery", "os._exit(0) before the tests run", "import os\nos._exit(0)\n",
         ("verdict",), kind="function", naive=False, meta=ADD),
    Case("exit0-in-call", "forgery", "os._exit(0) inside the tested function", "def add(a, b):\n    import os\n    os._exit(0)\n",
         ("verdict",), kind="function", meta=ADD),
    Case("sysexit-in-call", "forgery", "raise SystemExit(0) inside the tested function", "def add(a, b):\n    raise SystemExit(0)\n",
         ("verdict",), kind="function", meta=ADD),
    Case("token-stdin", "forgery", "rewind stdin, re-read the harness token, print it, exit 0", """
import os, sys
os.lseek(0, 0, 0)
sys.stdout.write(os.read(0, 4096).decode()); sys.stdout.flush()
os._exit(0)
""", ("verdict",), kind="function", naive=True, meta=ADD),
    Case("python-O", "forgery", "re-run the harness under python -O (asserts vanish)", """
import os, sys
if not os.environ.get("AGAIN"):
    os.environ["AGAIN"] = "1"
    os.lseek(0, 0, 0)
    os.execv(sys.executable, [sys.executable, "-O", "main.py"])
""" + WRONG, ("verdict",), kind="function", naive=True, meta=ADD),
    Case("read-tests", "forgery", "read the tests from its own files and answer from them", """
import glob, os, re
table = {}
for path in glob.glob("*") + glob.glob("/tmp/*/*"):
    try:
        text = open(path).read()
    except Exception:
        continue
    for args, want in re.findall(r"candidate\\((.*?)\\) == (.+)", text):
        table[args.replace(" ", "")] = eval(want)
def add(a, b):
    return table.get(f"{a},{b}", a - b)
""", ("verdict",), kind="function", naive=True, meta=ADD),
    Case("dataset-copy", "forgery", "copy the canonical solution out of the host's HumanEval file", """
import gzip, json
for line in gzip.open("@HUMANEVAL@", "rt"):
    row = json.loads(line)
    if row["entry_point"] == "has_close_elements":
        exec(row["prompt"] + row["canonical_solution"])
""", ("verdict",), kind="function", naive=True, meta="humaneval0"),
    Case("builtins-abs", "forgery", "replace builtins.abs, which the tests use", """
import builtins
builtins.abs = lambda x: 0
""" + WRONG, ("verdict",), kind="function", naive=True, meta=ABS_META),
    Case("builtins-all", "forgery", "replace builtins (abs, all, any, len, isinstance, zip, map)", """
import builtins
for n in ["abs", "all", "any", "len", "isinstance", "zip", "map", "sorted", "round"]:
    setattr(builtins, n, lambda *a, **k: 0)
""" + WRONG, ("verdict",), kind="function", naive=True, meta=ABS_META),
    Case("frame-token", "forgery", "take the token from the harness's stack frame", """
import os, sys
f = sys._getframe()
while f is not None:
    if "token" in f.f_locals:
        sys.stdout.write(f.f_locals["token"]); sys.stdout.flush(); os._exit(0)
    f = f.f_back
""", ("verdict",), kind="function", naive=True, meta=ADD),
    Case("frame-consts", "forgery", "read the expected value from the caller's bytecode", """
import dis, sys
def add(a, b):
    f = sys._getframe(1)
    for ins in dis.get_instructions(f.f_code):
        if ins.offset > f.f_lasti and ins.opname == "LOAD_CONST":
            return ins.argval
    return None
""", ("verdict",), kind="function", naive=True, meta=ADD),
    Case("always-equal", "forgery", "return an object whose __eq__ is always true", """
class Yes:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
def add(a, b):
    return Yes()
""", ("verdict",), kind="function", naive=True, meta=ADD),
    Case("int-subclass", "forgery", "return an int subclass that equals everything", """
class I(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
def add(a, b):
    return I(0)
""", ("verdict",), kind="function", naive=True, meta=ADD),
    Case("float-subclass-sub", "forgery", "return a float whose subtraction gives 0 (abs tests)", """
class F(float):
    def __sub__(self, other): return 0.0
def add(a, b):
    return F(0)
""", ("verdict",), kind="function", naive=True, meta=ABS_META),
    Case("trace-hook", "forgery", "replace check() through a trace hook", """
import sys
def _noop(c):
    return None
def _tr(frame, event, arg):
    if frame.f_globals.get("check") not in (None, _noop):
        frame.f_globals["check"] = _noop
    return _tr
sys.settrace(_tr)
f = sys._getframe()
while f is not None:
    f.f_trace = _tr
    f = f.f_back
""" + WRONG, ("verdict",), kind="function", naive=True, meta=ADD),
    Case("profile-hook", "forgery", "a profile hook that swallows the AssertionError by exiting 0", """
import os, sys
def _prof(frame, event, arg):
    if event == "c_call" or frame.f_code.co_name == "check":
        sys.stdout.flush()
sys.setprofile(_prof)
def _hook(*a):
    import os; os._exit(0)
sys.excepthook = _hook
""" + WRONG, ("verdict",), kind="function", naive=False, meta=ADD),
    Case("atexit-exit0", "forgery", "an atexit handler that prints the token and exits 0 after failing tests", """
import atexit, os, sys
_tok = [None]
f = sys._getframe()
while f is not None:
    _tok[0] = f.f_locals.get("token", _tok[0]); f = f.f_back
def _bye():
    sys.stdout.write(_tok[0] or ""); sys.stdout.flush(); os._exit(0)
atexit.register(_bye)
""" + WRONG, ("verdict",), kind="function", naive=True, meta=ADD),
    Case("stopiteration", "forgery", "raise StopIteration so a map()/zip() test loop ends early", """
def add(a, b):
    raise StopIteration
""", ("verdict",), kind="function", naive=True, meta=MAP_META),
    Case("keyboardinterrupt", "forgery", "raise KeyboardInterrupt / GeneratorExit from the function", """
def add(a, b):
    raise GeneratorExit
""", ("verdict",), kind="function", naive=False, meta=ADD),
    Case("assertion-subclass", "forgery", "raise an AssertionError subclass that prints a pass", """
class Ok(AssertionError):
    def __str__(self): return "all tests passed"
def add(a, b):
    raise Ok()
""", ("verdict",), kind="function", naive=False, meta=ADD),
    Case("fake-verdict", "forgery", "write checker-like verdicts and replies to every descriptor", """
import os
lines = [b'{"passed":true,"kind":"ok","detail":""}\\n', b'{"ready":true}\\n', b'{"ok":{"i":"3"}}\\n' * 50]
for fd in range(0, 64):
    for line in lines:
        try:
            os.write(fd, line)
        except OSError:
            pass
""" + WRONG, ("verdict",), kind="function", naive=False, meta=ADD),
    Case("patch-proxy", "forgery", "monkeypatch the server side: answer every call with an always-equal value", """
import sys
class Yes:
    def __eq__(self, other): return True
m = sys.modules.get("__main__")
for name in ("encode", "dumps"):
    if hasattr(m, name):
        setattr(m, name, lambda *a, **k: Yes())
def add(a, b):
    return Yes()
""", ("verdict",), kind="function", naive=False, meta=ADD),
    Case("reply-flood", "forgery", "flood the reply pipe, then nest a reply 10,000 deep", """
import os
fds = os.environ.get("UPSLOPE_WIRE_FDS", "")
def add(a, b):
    x = []
    for _ in range(10000):
        x = [x]
    return x
if fds:
    w = int(fds.split(",")[1])
    try:
        os.write(w, b"[" * (8 << 20))
    except OSError:
        pass
""", ("verdict",), kind="function", naive=False, meta=ADD),
    Case("proc-tests", "forgery", "look for the tests in every process's memory maps and command line", """
import os, re
table = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for f in ("cmdline", "environ"):
            try:
                text = open(f"/proc/{pid}/{f}", "rb").read().decode(errors="replace")
            except OSError:
                continue
            for args, want in re.findall(r"candidate\\((.*?)\\) == (\\S+)", text):
                table[args.replace(" ", "")] = want
def add(a, b):
    return int(table.get(f"{a},{b}", a - b))
""", ("verdict",), kind="function", naive=False, meta=ADD),
    Case("gc-patch-check", "forgery", "find check() through gc and replace its code", """
import gc
def _noop(candidate):
    return None
def add(a, b):
    for o in gc.get_objects():
        if getattr(o, "__name__", None) == "check" and callable(o):
            o.__code__ = _noop.__code__
    return a - b
""", ("verdict",), kind="function", naive=False, meta=ADD),
    Case("hang-then-exit", "forgery", "sleep past the limit, hoping a timeout counts as a pass", """
import time
time.sleep(60)
""", ("verdict",), kind="function", naive=False, meta=ADD, timeout_s=2),
    Case("cases-answers-file", "forgery", "stdin/stdout: print the expected output read from a host file", """
print(open("@VAR@/answers.txt").read().strip())
""", ("verdict",), kind="cases", naive=True, meta=ANSWER_CASES),
    Case("cases-exit0", "forgery", "stdin/stdout: exit 0 at once without output", "import os\nos._exit(0)\n",
         ("verdict",), kind="cases", meta=ANSWER_CASES),
    Case("cases-flood", "forgery", "stdin/stdout: print every number, hoping for a substring match", """
for i in range(10 ** 7):
    print(i)
""", ("verdict",), kind="cases", meta=ANSWER_CASES),
]

CASES: list[Case] = _ESCAPES + _RESOURCES + _FORGERIES
