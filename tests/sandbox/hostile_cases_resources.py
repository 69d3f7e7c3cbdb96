"""Hostile programs that spend resources sideways (the first suite is hostile_cases.py): lenient tests that catch
exceptions, kernel memory in socket buffers, and memory the checker spends on a program's values."""
from __future__ import annotations

from hostile_cases import ADD, Case

# A lenient test: a call that raises counts as skipped (what a "bad input may raise" test does)
CATCH_META = {**ADD, "test": "def check(candidate):\n    for a, b, want in [(1, 2, 3), (2, 2, 4)]:\n"
                             "        try:\n            got = candidate(a, b)\n        except:\n"
                             "            continue\n        assert got == want\n"}

MORE: list[Case] = [
    Case("socket-buffers", "resource", "queue data in loopback TCP and UDP socket buffers (kernel memory)", """
import socket, time
held, total = [], 0
try:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    for _ in range(24):
        c = socket.create_connection(srv.getsockname())
        held += [c, srv.accept()[0]]
        c.setblocking(False)
        try:
            while total < (600 << 20):
                total += c.send(b"x" * 65536)
        except BlockingIOError:
            pass
    for _ in range(24):
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        r.bind(("127.0.0.1", 0))
        held.append(r)
        for _ in range(100):
            total += r.sendto(b"x" * 60000, r.getsockname())
except OSError as e:
    print(type(e).__name__, e)
print("queued MiB", total >> 20, flush=True)
time.sleep(0.5)
""", ("sockmem",), naive=True),
    Case("caught-exit", "forgery", "exit inside a call that the test wraps in a bare except", """
import os
def add(a, b):
    os._exit(0)
""", ("verdict",), kind="function", meta=CATCH_META),
    Case("caught-hang", "forgery", "hang inside a call that the test wraps in a bare except", """
import time
def add(a, b):
    time.sleep(60)
""", ("verdict",), kind="function", meta=CATCH_META, timeout_s=2),
    Case("caught-uncrossable", "forgery", "return a value that cannot cross, where the test catches exceptions", """
def add(a, b):
    return object()
""", ("verdict",), kind="function", meta=CATCH_META),
    Case("caught-garbage", "forgery", "answer with malformed replies, where the test catches exceptions", """
import os
def add(a, b):
    for fd in range(3, 64):
        try:
            os.write(fd, b'{"raise": 7}\\n{"neither": 1}\\n')
        except OSError:
            pass
    return 0
""", ("verdict",), kind="function", meta=CATCH_META),
    Case("checker-memory", "resource", "return an int that the test code grows into a 1.5 GB string in the checker", """
def add(a, b):
    return 3 * 10 ** 9 // 4
""", ("checker_memory",), kind="function", meta={**ADD, "test": "def check(candidate):\n"
                                                             "    assert len('ab' * candidate(1, 2)) == 6\n"}),
]
