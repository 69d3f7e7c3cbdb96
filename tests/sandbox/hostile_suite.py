"""The hostile suite: programs that try to escape the sandbox, abuse its resources, or forge
a pass of the `code` reward, each judged by a check OUTSIDE the sandbox that can fail.

Outside checks (detectors), each fed by the host, never by the program's word:
- `files`: bait files on the host (under /var/tmp, /dev/shm, /tmp, writable by anyone)
  unchanged, and no new file in the host's writable drop directories;
- `leak`: no secret of the host's (bait files under /var/tmp, /opt, /srv, /mnt, /home, the
  project, a model cache, the data sets, /etc/shadow, another process's command line, the
  trainer's environment) appears in what the program printed or returned;
- `listeners`: host TCP, UDP, unix stream, unix datagram, abstract unix and FIFO listeners
  received nothing;
- `leftover`: no process carrying the case's marker, and none of the sandbox's uids, is alive
  after the run; a host victim process is still alive and not stopped;
- `memory` / `inodes` / `disk` / `oom_adj`: a host thread samples, every 20 ms, the summed
  resident memory of the sandbox's processes, their oom_score_adj, and the inodes and bytes
  used on the runs' own tmpfs mounts;
- `checker_memory`: the resident memory of the function tests' checker processes (outside
  the sandbox, found by their command line) stays under the run's per-process limit;
- `sockmem`: the host's TCP and UDP buffer memory (/proc/net/sockstat, counted across all
  network namespaces) grows by less than SOCKMEM_LIMIT during the run;
- `status`: how the sandbox says the run ended (timeout, memory, output_limit...) and how
  long it took by the host's clock; the host still starts a process promptly;
- `verdict`: the `code` reward (the real one) gave 0 to a forgery.

`python tests/sandbox/hostile_suite.py` prints the table for docs/sandbox.md.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from hostile_cases import CASES as FIRST_CASES
from hostile_cases import SECRET_DIRS, Case
from hostile_cases_resources import MORE
from sandbox_helpers import (CHECKER_MARK, mounted_usage, pids_with_marker, pids_with_uid_in, rss_of, run_mounts,
                             socket_memory)

from upslope.sandbox import Job, SandboxConfig, SandboxPool

CONFIG = SandboxConfig(timeout_s=3.0, memory_mb=512, run_memory_mb=1024, max_inodes=2048, disk_mb=32,
                       max_output_bytes=1 << 20, max_procs=32)
MEMORY_SLACK = 64 << 20  # page-cache and accounting noise on top of the run's limit
FALLBACK_SLACK = 768 << 20  # without cgroups: what 6 processes may add in one 0.1 s poll
SOCKMEM_LIMIT = 128 << 20  # TCP + UDP buffer memory a run may add on the host (others' traffic included)
CASES = FIRST_CASES + MORE
HUMANEVAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data",
                         "humaneval", "HumanEval.jsonl.gz")


# ------------------------------------------------------------------------------------ the host's bait
class Bait:
    """Everything on the host that the programs go after, set up before and checked after."""

    def __init__(self) -> None:
        self.tag = f"upslope-bait-{os.getpid()}-{secrets.token_hex(4)}"
        self.secret = "SECRET" + secrets.token_hex(16)
        self.dirs: list[str] = []
        self.secret_files: dict[str, str] = {}
        self.canaries: dict[str, str] = {}
        self.drops: list[str] = []
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.hits: dict[str, int] = {}
        self._make_files()
        self._make_listeners()
        self.victim = subprocess.Popen(["sh", "-c", "sleep 600; :", self.secret], stdin=subprocess.DEVNULL)

    # files ---------------------------------------------------------------------------
    def _dir(self, parent: str, mode: int = 0o755) -> str:
        d = os.path.join(parent, self.tag)
        os.makedirs(d, exist_ok=True)
        os.chmod(d, mode)
        self.dirs.append(d)
        return d

    def _make_files(self) -> None:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for label, where in SECRET_DIRS.items():
            d = self._dir(repo if where == "repo" else os.path.expanduser(where))
            path = os.path.join(d, "secret.txt")
            with open(path, "w") as f:
                f.write(self.secret + "\n")
            os.chmod(path, 0o644)  # readable by any user: only the mount allow-list hides it
            self.secret_files[label] = path
        os.environ["UPSLOPE_BAIT_SECRET"] = self.secret  # the trainer's environment
        for where in ("/var/tmp", "/dev/shm", "/tmp"):
            d = self._dir(where, 0o777)
            canary = os.path.join(d, "canary.txt")
            with open(canary, "w") as f:
                f.write("the host's data\n")
            os.chmod(canary, 0o666)  # writable by any user
            self.canaries[canary] = self._digest(canary)
            self.drops.append(d)
        self.var = self.dirs[0]

    @staticmethod
    def _digest(path: str) -> str:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    def file_changes(self) -> list[str]:
        out = []
        for path, digest in self.canaries.items():
            if not os.path.exists(path) or self._digest(path) != digest:
                out.append(f"{path} changed")
        for d in self.drops:
            extra = set(os.listdir(d)) - {"canary.txt", "secret.txt", "sock", "dgram", "fifo", "answers.txt"}
            if extra:
                out.append(f"new in {d}: {sorted(extra)}")
        return out

    # listeners -----------------------------------------------------------------------
    def _serve(self, name: str, sock: socket.socket, stream: bool) -> None:
        sock.settimeout(0.1)
        self.hits[name] = 0

        def loop() -> None:
            while not self.stop.is_set():
                try:
                    if stream:
                        conn, _ = sock.accept()
                        conn.close()
                    else:
                        sock.recv(65536)
                    self.hits[name] += 1
                except OSError:
                    pass
            sock.close()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        self.threads.append(t)

    def _make_listeners(self) -> None:
        tcp = socket.socket()
        tcp.bind(("0.0.0.0", 0))
        tcp.listen(16)
        self.tcp_port = tcp.getsockname()[1]
        self._serve("tcp", tcp, True)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("0.0.0.0", 0))
        self.udp_port = udp.getsockname()[1]
        self._serve("udp", udp, False)
        self.unix_path = os.path.join(self.var, "sock")
        unix = socket.socket(socket.AF_UNIX)
        unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        unix.listen(16)
        self._serve("unix", unix, True)
        self.dgram_path = os.path.join(self.var, "dgram")
        dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dgram.bind(self.dgram_path)
        os.chmod(self.dgram_path, 0o777)
        self._serve("dgram", dgram, False)
        self.abstract = "\0" + self.tag
        ab = socket.socket(socket.AF_UNIX)
        ab.bind(self.abstract)
        ab.listen(16)
        self._serve("abstract", ab, True)
        self.fifo_path = os.path.join(self.var, "fifo")
        os.mkfifo(self.fifo_path, 0o666)
        os.chmod(self.fifo_path, 0o666)
        fd = os.open(self.fifo_path, os.O_RDONLY | os.O_NONBLOCK)
        keep = os.open(self.fifo_path, os.O_WRONLY | os.O_NONBLOCK)  # so the reader never sees EOF
        self.hits["fifo"] = 0

        def fifo_loop() -> None:
            while not self.stop.is_set():
                try:
                    self.hits["fifo"] += len(os.read(fd, 65536))
                except BlockingIOError:
                    time.sleep(0.02)
            os.close(fd)
            os.close(keep)

        t = threading.Thread(target=fifo_loop, daemon=True)
        t.start()
        self.threads.append(t)
        answers = os.path.join(self.var, "answers.txt")
        with open(answers, "w") as f:
            f.write("42\n")
        os.chmod(answers, 0o644)

    def restore(self) -> None:
        """Put the bait back as it was (after a self-test ran an attack unsandboxed)."""
        for path in self.canaries:
            if os.path.exists(path + ".x"):
                os.rename(path + ".x", path)
            if os.path.islink(path):
                os.unlink(path)
            with open(path, "w") as f:
                f.write("the host's data\n")
            os.chmod(path, 0o666)
        for d in self.drops:
            for name in set(os.listdir(d)) - {"canary.txt", "secret.txt", "sock", "dgram", "fifo", "answers.txt"}:
                os.unlink(os.path.join(d, name))
        for d in ("/dev/shm", "/tmp"):
            if os.path.exists(os.path.join(d, self.tag + ".x")):
                os.unlink(os.path.join(d, self.tag + ".x"))
        for k in self.hits:
            self.hits[k] = 0

    def listener_hits(self) -> dict[str, int]:
        time.sleep(0.15)  # let the accept loops see what arrived
        return {k: v for k, v in self.hits.items() if v}

    def victim_ok(self) -> bool:
        if self.victim.poll() is not None:
            return False
        with open(f"/proc/{self.victim.pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("T", "t")

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)
        self.victim.kill()
        self.victim.wait()
        os.environ.pop("UPSLOPE_BAIT_SECRET", None)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def fill(self, text: str) -> str:
        subs = {
            "@VAR@": self.var, "@TCP@": str(self.tcp_port), "@UDP@": str(self.udp_port),
            "@UNIX@": self.unix_path, "@DGRAM@": self.dgram_path, "@ABSTRACT@": self.tag,
            "@FIFO@": self.fifo_path, "@VICTIM@": str(self.victim.pid), "@HUMANEVAL@": os.path.abspath(HUMANEVAL),
            "@CANARIES@": repr(sorted(self.canaries)), "@DROPS@": repr(self.drops),
            "@SECRETS@": repr(sorted(self.secret_files.values())),
            **{f"@SECRET_{k}@": v for k, v in self.secret_files.items()},
        }
        for k, v in subs.items():
            text = text.replace(k, v)
        return text


# ------------------------------------------------------------------------------------ host sampler
class Sampler:
    """Samples, every 20 ms, what the sandbox's processes hold on the host."""

    def __init__(self, uids: range | None, checkers: bool = False):
        self.uids = uids
        self.peak_rss = 0
        self.min_oom_adj: int | None = None  # over the whole run
        self.last_oom_adj: int | None = None  # in the last sample that saw a process of the run
        self.peak_inodes = 0
        self.peak_bytes = 0
        self.checkers = checkers
        self.peak_checker_rss = 0
        self.base_sockmem = socket_memory()
        self.peak_sockmem = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.02)

    def sample(self) -> None:
        rss, adjs = 0, []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if self.uids is not None and entry.stat().st_uid not in self.uids:
                    continue
                with open(f"/proc/{entry.name}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            rss += int(line.split()[1]) << 10
                with open(f"/proc/{entry.name}/oom_score_adj") as f:
                    adjs.append(int(f.read()))
            except (OSError, ValueError):
                pass
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_sockmem = max(self.peak_sockmem, socket_memory() - self.base_sockmem)
        if self.checkers:
            self.peak_checker_rss = max(self.peak_checker_rss, sum(rss_of(p) for p in pids_with_marker(CHECKER_MARK)))
        if adjs:
            self.last_oom_adj = min(adjs)
            self.min_oom_adj = min(adjs + ([self.min_oom_adj] if self.min_oom_adj is not None else []))
        for mount in run_mounts():
            st = mounted_usage(mount)
            if st is None:
                continue
            self.peak_inodes = max(self.peak_inodes, st.f_files - st.f_ffree)
            self.peak_bytes = max(self.peak_bytes, (st.f_blocks - st.f_bfree) * st.f_frsize)


# ------------------------------------------------------------------------------------ detectors
@dataclass
class Seen:
    """What the host observed around one case."""

    output: str = ""
    statuses: list[str] = field(default_factory=list)
    reward: float | None = None
    wall_s: float = 0.0
    files: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    leftovers: list[int] = field(default_factory=list)
    victim_ok: bool = True
    kernel: list[str] = field(default_factory=list)
    peak_rss: int = 0
    min_oom_adj: int | None = None
    last_oom_adj: int | None = None
    peak_inodes: int = 0
    peak_bytes: int = 0
    peak_sockmem: int = 0
    peak_checker_rss: int = 0
    responsive_s: float = 0.0


def leak_markers(bait: Bait) -> list[str]:
    """Strings whose presence in a program's output means a host secret leaked."""
    marks = [bait.secret]
    try:
        with open("/etc/shadow") as f:
            marks.append(f.readline().strip())
    except OSError:
        pass
    if os.path.exists(HUMANEVAL):
        marks.append("for idx, elem in enumerate(numbers):")  # HumanEval/0's canonical solution
    return [m for m in marks if m]


def detect(check: str, case: Case, seen: Seen, bait: Bait, config: SandboxConfig = CONFIG) -> str | None:
    """The violation `check` sees in `seen`, or None when the case was contained."""
    if check == "files":
        return "; ".join(seen.files) or None
    if check == "leak":
        found = [m[:24] for m in leak_markers(bait) if m in seen.output]
        return f"leaked {found}" if found else None
    if check == "listeners":
        return f"host listeners reached: {seen.hits}" if seen.hits else None
    if check == "leftover":
        if seen.leftovers:
            return f"processes left behind: {seen.leftovers}"
        return None if seen.victim_ok else "the host victim process was killed or stopped"
    if check == "kernel":
        return "; ".join(seen.kernel) or None
    if check == "memory":
        limit = config.run_memory_bytes + MEMORY_SLACK
        return f"the run held {seen.peak_rss >> 20} MiB > {limit >> 20} MiB" if seen.peak_rss > limit else None
    if check == "memory_fallback":  # polled every 0.1 s: it may pass the limit by what 0.1 s allocates
        limit = config.run_memory_bytes + FALLBACK_SLACK
        return f"the run held {seen.peak_rss >> 20} MiB > {limit >> 20} MiB" if seen.peak_rss > limit else None
    if check == "checker_memory":
        limit = (config.memory_mb << 20) + MEMORY_SLACK
        return f"a checker held {seen.peak_checker_rss >> 20} MiB" if seen.peak_checker_rss > limit else None
    if check == "sockmem":
        return f"{seen.peak_sockmem >> 20} MiB in socket buffers" if seen.peak_sockmem > SOCKMEM_LIMIT else None
    if check == "inodes":
        return f"{seen.peak_inodes} inodes > {config.max_inodes}" if seen.peak_inodes > config.max_inodes else None
    if check == "disk":
        limit = config.disk_mb << 20
        return f"{seen.peak_bytes >> 20} MiB on its tmpfs > {config.disk_mb}" if seen.peak_bytes > limit else None
    if check == "oom_adj":  # a program may lower its own score; the supervisor puts it back within 0.1 s
        if seen.last_oom_adj is None:
            return "no process of the run was seen"
        return f"oom_score_adj stayed at {seen.last_oom_adj} < 1000" if seen.last_oom_adj < 1000 else None
    if check == "status":
        bad = [s for s in seen.statuses if s not in case.status]
        if bad:
            return f"ended {bad}, expected {case.status}"
        return f"took {seen.wall_s:.1f} s > {case.max_wall}" if seen.wall_s > case.max_wall else None
    if check == "responsive":
        return f"the host took {seen.responsive_s:.1f} s to start a process" if seen.responsive_s > 2.0 else None
    if check == "verdict":
        return f"forged a pass: reward {seen.reward}" if seen.reward is None or seen.reward != 0.0 else None
    raise ValueError(f"unknown check {check!r}")


# ------------------------------------------------------------------------------------ running
def meta_for(case: Case) -> dict:
    if case.meta == "humaneval0":
        import gzip
        import json

        with gzip.open(HUMANEVAL, "rt") as f:
            row = json.loads(f.readline())
        return {"code_prefix": row["prompt"], "entry_point": row["entry_point"], "test": row["test"]}
    return dict(case.meta)


def _kernel_state() -> dict[str, str]:
    out = {}
    for p in ("/proc/sys/vm/swappiness", "/proc/sys/kernel/hostname"):
        try:
            with open(p) as f:
                out[p] = f.read()
        except OSError:
            pass
    return out


def run_case(case: Case, bait: Bait, pool: SandboxPool) -> Seen:
    """Run one case in the sandbox (through the pool, or the `code` reward) and observe the host."""
    from upslope.registry import REWARDS

    marker = f"upslope-mark-{secrets.token_hex(6)}"
    code = bait.fill(case.code).replace("@MARKER@", marker).replace("@TAG@", bait.tag)
    seen = Seen()
    kernel_before = _kernel_state()
    saved = pool.sandbox.cgroups
    if case.id.endswith("-fallback"):
        pool.sandbox.cgroups = None
    t = time.monotonic()
    try:
        with Sampler(pool.sandbox.uid_range, checkers="checker_memory" in case.checks) as sampler:
            if case.kind == "run":
                jobs = [Job(code=code, timeout_s=case.timeout_s) for _ in range(case.batch)]
                results = pool.run_many(jobs)
                seen.statuses = [str(r.status) for r in results]
                seen.output = "".join(r.stdout + r.stderr for r in results)
            else:
                meta = meta_for(case)
                if case.timeout_s:
                    meta["timeout_s"] = case.timeout_s
                reward = REWARDS.bind("code", {"timeout_s": CONFIG.timeout_s, "memory_mb": CONFIG.memory_mb})
                [seen.reward] = reward([f"```python\n{code}```"], [None], [meta])
                seen.statuses = [meta["sandbox_status"]]
            seen.wall_s = time.monotonic() - t
            t0 = time.monotonic()
            subprocess.run(["true"], check=True)
            seen.responsive_s = time.monotonic() - t0
    finally:
        pool.sandbox.cgroups = saved
    seen.peak_rss, seen.min_oom_adj, seen.last_oom_adj = sampler.peak_rss, sampler.min_oom_adj, sampler.last_oom_adj
    seen.peak_inodes, seen.peak_bytes = sampler.peak_inodes, sampler.peak_bytes
    seen.peak_sockmem, seen.peak_checker_rss = sampler.peak_sockmem, sampler.peak_checker_rss
    for _ in range(40):
        seen.leftovers = pids_with_marker(marker) + pids_with_uid_in(pool.sandbox.uid_range)
        if not seen.leftovers:
            break
        time.sleep(0.05)
    seen.files = bait.file_changes()
    for d in ("/dev/shm", "/tmp"):
        if os.path.exists(os.path.join(d, bait.tag + ".x")):
            seen.files.append(f"{d}/{bait.tag}.x created on the host")
    seen.hits = bait.listener_hits()
    seen.victim_ok = bait.victim_ok()
    after = _kernel_state()
    seen.kernel = [f"{p} changed" for p in kernel_before if after.get(p) != kernel_before[p]]
    return seen


NAIVE_HARNESS = """\
import os, sys, types
def _upslope_harness():
    token = sys.stdin.readline()
    with open("solution.py", encoding="utf-8") as f:
        code = compile(f.read(), "solution.py", "exec")
    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    try:
        exec(code, module.__dict__)
    except SystemExit as exc:
        os._exit(1)
    sys.stdout.flush()
    sys.stdout.write(token)
    sys.stdout.flush()
_upslope_harness()
"""


def _plain_run(argv: list[str], cwd: str, stdin: str, env: dict) -> tuple[int, str, str]:
    """Run with no sandbox; output through files, so a daemon holding them cannot stall us."""
    with tempfile.TemporaryFile() as i, tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e:
        i.write(stdin.encode())
        i.seek(0)
        rc = subprocess.run(argv, cwd=cwd, stdin=i, stdout=o, stderr=e, timeout=20, env=env).returncode
        o.seek(0)
        e.seek(0)
        return rc, o.read().decode(errors="replace"), e.read().decode(errors="replace")


def run_naive(case: Case, bait: Bait) -> Seen:
    """The same attack with NO sandbox: a plain subprocess on the host, and for forgeries the
    in-process token harness upslope once used. The detectors must fire here."""
    from upslope.rewards.code import extract_code, solution_program

    marker = f"upslope-mark-{secrets.token_hex(6)}"
    code = bait.fill(case.code).replace("@MARKER@", marker).replace("@TAG@", bait.tag)
    seen = Seen()
    work = tempfile.mkdtemp(prefix="upslope-naive-")
    env = {**os.environ, "UPSLOPE_BAIT_SECRET": bait.secret, "UPSLOPE_NAIVE": "1"}
    try:
        if case.kind == "function":
            meta = meta_for(case)
            program = solution_program(extract_code(code, meta.get("entry_point")), meta)
            program = program.rstrip() + "\n\n\n" + meta["test"].rstrip() + f"\n\ncheck({meta['entry_point']})\n"
            with open(os.path.join(work, "solution.py"), "w") as f:
                f.write(program)
            with open(os.path.join(work, "main.py"), "w") as f:
                f.write(NAIVE_HARNESS)
            token = secrets.token_hex(16)
            rc, out, err = _plain_run([sys.executable, "main.py"], work, token + "\n", env)
            seen.reward = 1.0 if rc == 0 and out.rstrip("\n").endswith(token) else 0.0
        else:
            stdin = meta_for(case)["cases"][0]["stdin"] if case.kind == "cases" else ""
            with Sampler(range(0)) as sampler:  # no uid: only the host-wide counters
                rc, out, err = _plain_run([sys.executable, "-c", code], work, stdin, env)
            seen.peak_sockmem = sampler.peak_sockmem
            if case.kind == "cases":
                want = meta_for(case)["cases"][0]["stdout"]
                seen.reward = 1.0 if rc == 0 and out.strip() == want.strip() else 0.0
        seen.output = out + err
        time.sleep(0.2)
        seen.leftovers = pids_with_marker(marker)
        seen.files = bait.file_changes()
        for d in ("/dev/shm", "/tmp"):
            if os.path.exists(os.path.join(d, bait.tag + ".x")):
                seen.files.append(f"{d}/{bait.tag}.x created on the host")
        seen.hits = bait.listener_hits()
        seen.victim_ok = bait.victim_ok()
    finally:
        for pid in pids_with_marker(marker):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)
        bait.restore()
    return seen


def make_pool() -> SandboxPool:
    return SandboxPool(CONFIG, workers=2)


def table(rows: list[tuple[Case, list[str]]]) -> str:
    """The markdown table of the suite: one line per class, then the totals."""
    groups: dict[str, list[tuple[Case, list[str]]]] = {}
    for case, problems in rows:
        groups.setdefault(case.group, []).append((case, problems))
    lines = ["| class | programs | blocked | escaped / forged | outside checks |", "|---|---|---|---|---|"]
    for group, items in groups.items():
        checks = sorted({c for case, _ in items for c in case.checks})
        bad = sum(1 for _, p in items if p)
        lines.append(f"| {group} | {len(items)} | {len(items) - bad} | {bad} | {', '.join(checks)} |")
    total_bad = sum(1 for _, p in rows if p)
    lines.append(f"| **all** | **{len(rows)}** | **{len(rows) - total_bad}** | **{total_bad}** | |")
    return "\n".join(lines)


def main() -> None:
    bait = Bait()
    rows = []
    try:
        with make_pool() as pool:
            for case in CASES:
                seen = run_case(case, bait, pool)
                problems = [p for p in (detect(c, case, seen, bait) for c in case.checks) if p]
                rows.append((case, problems))
                print(f"{case.group:9} {case.id:22} {'ESCAPED ' + '; '.join(problems) if problems else 'blocked'}"
                      f"  [{','.join(seen.statuses)[:40]}] {seen.wall_s:.2f}s", file=sys.stderr)
    finally:
        bait.close()
    print(table(rows))
    print()
    print("| id | class | attack | outside checks | result |")
    print("|---|---|---|---|---|")
    for case, problems in rows:
        print(f"| {case.id} | {case.group} | {case.what} | {', '.join(case.checks)} | {'ESCAPED' if problems else 'blocked'} |")


if __name__ == "__main__":
    main()
