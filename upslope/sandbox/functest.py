"""Function tests whose verdict the tested code cannot forge.

The candidate's program runs in the sandbox as module `solution` under a small server
(SERVER_SOURCE) that answers calls. The tests run in a separate checker process outside
the sandbox (CHECKER_SOURCE, run as `python -I -S -c` and kept for one test after another): it executes the trusted test code
with the tested function replaced by a proxy, and the proxy sends each call into the
sandbox over a pipe. Only plain data crosses (upslope.sandbox.wire: JSON trees rebuilt from
built-in types on the checker's side), so no object of the candidate's (an always-equal
`__eq__`, a patched builtin, a trace hook, a fake exception) ever reaches the test code,
and the test code is never inside the sandbox. The verdict is what the checker saw: every
test ran to its end without an exception. How the sandboxed process exits does not count.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_WIRE = (Path(__file__).with_name("wire.py")).read_text()
SOLUTION_NAME = "solution.py"
FD_ENV = "UPSLOPE_WIRE_FDS"  # "<read fd>,<write fd>" of the server's end of the pipes
KINDS = ("ok", "failed", "syntax_error", "load_error", "exited", "timeout", "memory", "error")


@dataclass(frozen=True)
class FunctionTest:
    """Tests of a program's functions, run by the checker outside the sandbox.

    `test`: trusted test code. With `entry_point` it defines `check(candidate)`, called with
    a proxy of that function; without it, it is plain code (asserts) whose free names are
    looked up in the solution. `prefix`: trusted code the tests may use (a prompt's helper
    functions), run in the checker before the tests.
    """

    test: str
    entry_point: str | None = None
    prefix: str = ""


@dataclass(frozen=True)
class Verdict:
    """What the checker decided: `passed` only when every test ran without an exception."""

    passed: bool
    kind: str  # one of KINDS
    detail: str = ""


SERVER_SOURCE = _WIRE + '''

def _upslope_serve():
    import os, sys, types
    rfd, wfd = (int(x) for x in os.environ.pop("UPSLOPE_WIRE_FDS").split(","))
    inp, out = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")

    def send(msg):
        out.write(dumps(msg))
        out.flush()

    def failure(exc):
        return {"raise": type(exc).__name__, "msg": str(exc)[:500]}

    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    try:
        with open("solution.py", encoding="utf-8") as f:
            code = compile(f.read(), "solution.py", "exec")
        exec(code, module.__dict__)
    except BaseException as exc:
        send({"load_error": type(exc).__name__, "msg": str(exc)[:500]})
        return
    sys.stdout.flush()
    send({"ready": True})
    while True:
        req = read_frame(inp)
        if req is None:
            break
        target = module.__dict__.get(req.get("name"), _upslope_serve)
        try:
            if req.get("op") == "get":
                if target is _upslope_serve:
                    send({"kind": "missing"})
                elif callable(target):
                    send({"kind": "callable"})
                else:
                    try:
                        send({"kind": "value", "v": encode(target)})
                    except WireError as exc:
                        send({"cannot_cross": str(exc)})
                continue
            if target is _upslope_serve:
                raise NameError("name %r is not defined" % req.get("name"))
            args = decode(req["args"])
            kwargs = decode(req["kwargs"])
            result = target(*args, **kwargs)
        except BaseException as exc:
            send(failure(exc))
            continue
        try:  # a value that cannot cross is no exception of the program's: the checker fails the test
            data = dumps({"ok": encode(result)})
        except WireError as exc:
            data = dumps({"cannot_cross": str(exc)})
        sys.stdout.flush()
        out.write(data)
        out.flush()


_upslope_serve()
'''

CHECKER_SOURCE = _WIRE + '''

import builtins, os, select, sys, time

# Exceptions of the candidate that a test may catch by type; all others (StopIteration,
# SystemExit, AssertionError, ...) arrive as CandidateError, which no test expects.
_MAPPED = {n: getattr(builtins, n) for n in (
    "ValueError", "TypeError", "IndexError", "KeyError", "ZeroDivisionError", "OverflowError",
    "AttributeError", "NotImplementedError")}


class CandidateError(Exception):
    pass


class Stop(BaseException):
    """The run cannot continue (the program exited, hung, or answered with something that is
    not a plain value or an exception): the verdict kind and why. Not an Exception, and the
    channel remembers the first one, so test code that catches exceptions around a call
    (`except Exception`, a bare `except`) cannot turn it into a pass."""

    def __init__(self, kind, detail):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class Channel:
    def __init__(self, rfd, wfd, deadline, cap):
        self.rfd, self.wfd, self.deadline, self.cap = rfd, wfd, deadline, cap
        self.buf = b""
        self.stopped = None  # the first Stop: it decides the verdict whatever the test did with it

    def stop(self, kind, detail):
        exc = Stop(kind, detail)
        if self.stopped is None:
            self.stopped = exc
        return exc

    def send(self, msg):
        if self.stopped is not None:
            raise self.stopped
        data = frame(msg)
        while data:
            try:
                data = data[os.write(self.wfd, data):]
            except BrokenPipeError:
                raise self.stop("exited", "the program exited before its tests finished") from None

    def recv(self):
        if self.stopped is not None:
            raise self.stopped
        while b"\\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise self.stop("timeout", "past the time limit")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise self.stop("exited", "the program exited before its tests finished")
            self.buf += chunk
            if len(self.buf) > self.cap:
                raise self.stop("failed", "a reply larger than the output limit")
        line, _, self.buf = self.buf.partition(b"\\n")
        try:
            msg = loads(line)
        except WireError as exc:
            raise self.stop("failed", "malformed reply: %s" % exc) from None
        if type(msg) is not dict:
            raise self.stop("failed", "malformed reply")
        return msg


def _raise_from(chan, msg):
    name, text = msg.get("raise"), msg.get("msg")
    text = text if type(text) is str else ""
    if "cannot_cross" in msg:
        raise chan.stop("failed", "a value that cannot cross: %s" % str(msg["cannot_cross"])[:500])
    if type(name) is not str:
        raise chan.stop("failed", "malformed reply")
    if name == "MemoryError":
        raise chan.stop("memory", "the program ran out of memory")
    cls = _MAPPED.get(name, CandidateError)
    raise cls("%s: %s" % (name, text) if cls is CandidateError else text)


def _proxy(chan, name):
    def proxy(*args, **kwargs):
        chan.send({"op": "call", "name": name, "args": encode(list(args)),
                   "kwargs": encode(dict(kwargs))})
        msg = chan.recv()
        if "ok" in msg:
            try:
                return decode(msg["ok"])
            except WireError as exc:
                raise chan.stop("failed", "bad return value: %s" % exc) from None
        _raise_from(chan, msg)
    proxy.__name__ = name
    return proxy


def _free_names(tree):
    import ast  # only for plain-assert tests: it costs a few ms of start-up

    stored, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stored.add(node.name)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stored.update((a.asname or a.name).split(".")[0] for a in node.names)
    return sorted(loaded - stored)


def _check(spec, chan):
    first = chan.recv()
    if "load_error" in first:
        name = first.get("load_error")
        kind = "syntax_error" if name in ("SyntaxError", "IndentationError", "TabError") else "load_error"
        if name == "MemoryError":
            kind = "memory"
        raise chan.stop(kind, "%s: %s" % (name, first.get("msg")))
    if first.get("ready") is not True:
        raise chan.stop("failed", "malformed first reply")
    ns = {"__name__": "__upslope_check__", "__builtins__": builtins}
    exec(compile(spec["prefix"], "<prefix>", "exec", optimize=0), ns)
    test = spec["test"]
    entry = spec["entry_point"]
    if entry:
        ns[entry] = _proxy(chan, entry)
    else:
        import ast

        test = compile(test, "<test>", "exec", flags=ast.PyCF_ONLY_AST, optimize=0)
        for name in _free_names(test):
            if name in ns or hasattr(builtins, name):
                continue
            chan.send({"op": "get", "name": name})
            msg = chan.recv()
            if msg.get("kind") == "callable":
                ns[name] = _proxy(chan, name)
            elif msg.get("kind") == "value":
                try:
                    ns[name] = decode(msg.get("v"))
                except WireError as exc:
                    raise chan.stop("failed", "bad value of %s: %s" % (name, exc)) from None
            elif msg.get("kind") != "missing":
                _raise_from(chan, msg)
    exec(compile(test, "<test>", "exec", optimize=0), ns)
    if entry:
        ns["check"](ns[entry])


def _limit_memory(limit):
    """The program's per-process memory limit holds here too (RLIMIT_AS, soft: the next test may
    set its own): a value of the program's that the test code grows ('ab' * n, [0] * n) ends
    in a MemoryError here instead of taking the host's memory."""
    import resource

    limit = max(limit, 256 << 20)  # room for the checker's own interpreter
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def judge(spec, rfd, wfd):
    """Run one test against the program behind (rfd, wfd); the verdict as a message."""
    chan = Channel(rfd, wfd, time.monotonic() + spec["timeout_s"], spec["cap"])
    try:
        _limit_memory(spec["memory"])
        _check(spec, chan)
        verdict = {"passed": True, "kind": "ok", "detail": ""}
    except Stop:
        verdict = None
    except AssertionError as exc:
        verdict = {"passed": False, "kind": "failed", "detail": ("AssertionError: %s" % exc)[:2000]}
    except BaseException as exc:
        verdict = {"passed": False, "kind": "failed", "detail": ("%s: %s" % (type(exc).__name__, exc))[:2000]}
    if chan.stopped is not None:  # even where the test code caught it and went on
        return {"passed": False, "kind": chan.stopped.kind, "detail": chan.stopped.detail[:2000]}
    return verdict


def main():
    """Serve tests one after another: each arrives on the control socket (a datagram with the
    spec and the two pipe ends), and its verdict goes back on it. The socket's EOF ends it."""
    import socket

    ctl = socket.socket(fileno=int(sys.argv[1]))
    try:  # the OOM killer's first choice, as the sandboxed programs are
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 1 << 24, 2)
        except OSError:
            return
        if not data or len(fds) != 2:
            return
        try:
            verdict = judge(loads(data), fds[0], fds[1])
        except BaseException as exc:
            verdict = {"passed": False, "kind": "error", "detail": ("%s: %s" % (type(exc).__name__, exc))[:2000]}
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        ctl.sendall(dumps(verdict))


main()
'''


def parse_verdict(raw: bytes) -> Verdict:
    """The checker's last line as a Verdict; a missing or malformed one is an error, never a pass."""
    import json

    try:
        msg = json.loads(raw.strip().splitlines()[-1])
        passed, kind, detail = msg["passed"], msg["kind"], msg["detail"]
        if type(passed) is not bool or kind not in KINDS or type(detail) is not str:
            raise ValueError
        return Verdict(passed and kind == "ok", kind, detail)
    except (ValueError, KeyError, IndexError, TypeError):
        return Verdict(False, "error", "the checker gave no verdict")
