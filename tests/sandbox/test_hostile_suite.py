"""The hostile suite (hostile_suite.py) in the sandbox, and the self-tests of its detectors:
each outside check fires when the attack runs unsandboxed or when it is fed a positive, so
a detector that can never fire is caught."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from hostile_suite import CASES, CONFIG, HUMANEVAL, Bait, Sampler, Seen, detect, make_pool, run_case, run_naive
from sandbox_helpers import mounted_usage, needs_bwrap

from upslope.sandbox import SandboxConfig

pytestmark = needs_bwrap
NAIVE = [c for c in CASES if c.naive]
DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "sandbox.md")


def _skip_missing(case):
    if "@HUMANEVAL@" in case.code or case.meta == "humaneval0":
        if not os.path.exists(HUMANEVAL):
            pytest.skip(f"HumanEval not found at {HUMANEVAL}")


@pytest.fixture(scope="module")
def bait():
    b = Bait()
    yield b
    b.close()


@pytest.fixture(scope="module")
def spool():
    p = make_pool()
    yield p
    p.close()


def test_suite_size_and_classes():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
    groups = {c.group for c in CASES}
    assert groups == {"escape", "resource", "forgery"}
    assert all(sum(c.group == g for c in CASES) >= 14 for g in groups)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_program_is_contained(case, bait, spool):
    _skip_missing(case)
    seen = run_case(case, bait, spool)
    problems = [p for p in (detect(c, case, seen, bait) for c in case.checks) if p]
    assert problems == [], (case.id, seen.statuses, seen.output[-500:])


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("case", NAIVE, ids=lambda c: c.id)
def test_detector_fires_when_the_attack_runs_unsandboxed(case, bait):
    """The same program with no sandbox (forgeries: the in-process token harness upslope had
    earlier) is caught by the case's own checks: the attack is real and the check can fail."""
    _skip_missing(case)
    seen = run_naive(case, bait)
    fired = [c for c in case.checks if c not in ("status",) and detect(c, case, seen, bait)]
    assert fired, (case.id, seen.output[-300:], seen.reward)


def _victim_restart(bait: Bait) -> None:
    """ptrace/kill self-tests stop or kill the victim: give the next case a fresh one."""
    if not bait.victim_ok():
        bait.victim.kill()
        bait.victim.wait()
        bait.victim = subprocess.Popen(["sh", "-c", "sleep 600; :", bait.secret], stdin=subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def _fresh_victim(request):
    yield
    if "bait" in request.fixturenames:
        _victim_restart(request.getfixturevalue("bait"))


POSITIVES = {
    "files": Seen(files=["/var/tmp/x changed"]),
    "leak": None,  # built from the bait's own secret below
    "listeners": Seen(hits={"unix": 1}),
    "leftover": Seen(leftovers=[12345]),
    "kernel": Seen(kernel=["/proc/sys/vm/swappiness changed"]),
    "memory": Seen(peak_rss=CONFIG.run_memory_bytes + (200 << 20)),
    "memory_fallback": Seen(peak_rss=CONFIG.run_memory_bytes + (2 << 30)),
    "inodes": Seen(peak_inodes=CONFIG.max_inodes + 1),
    "disk": Seen(peak_bytes=(CONFIG.disk_mb << 20) + 4096),
    "oom_adj": Seen(last_oom_adj=0),
    "status": Seen(statuses=["ok"], wall_s=0.1),
    "responsive": Seen(responsive_s=5.0),
    "sockmem": Seen(peak_sockmem=512 << 20),
    "checker_memory": Seen(peak_checker_rss=(CONFIG.memory_mb << 20) + (200 << 20)),
    "verdict": Seen(reward=1.0),
}


@pytest.mark.parametrize("check", sorted({c for case in CASES for c in case.checks}))
def test_every_detector_fires_on_a_positive_and_passes_a_negative(check, bait):
    case = next(c for c in CASES if check in c.checks and (check != "status" or "ok" not in c.status))
    positive = POSITIVES[check] or Seen(output=f"found: {bait.secret}")
    assert detect(check, case, positive, bait), check
    negative = Seen(statuses=list(case.status[:1]), reward=0.0, last_oom_adj=1000)
    assert detect(check, case, negative, bait) is None, check
    if check == "leftover":
        assert detect(check, case, Seen(victim_ok=False), bait)
    if check == "status":
        assert detect(check, case, Seen(statuses=list(case.status[:1]), wall_s=case.max_wall + 1), bait)


def test_sampler_sees_memory_and_oom_score_of_a_run_uid(spool):
    """The memory and oom_adj checks read what the sampler reads: prove it sees a real
    process of a sandbox uid (run here unsandboxed, 200 MiB, oom_score_adj 0)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run as a sandbox uid")
    uid = spool.sandbox.uid_range[-1]
    code = "import time\nb = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ready', flush=True)\ntime.sleep(30)"
    proc = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-c", code],
                            stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert proc.stdout.readline().strip() == "ready"
        with Sampler(spool.sandbox.uid_range) as sampler:
            time.sleep(0.2)
        assert sampler.peak_rss >= 190 << 20 and sampler.last_oom_adj == 0
        small = SandboxConfig(run_memory_mb=100)
        seen = Seen(peak_rss=sampler.peak_rss, last_oom_adj=sampler.last_oom_adj)
        case = next(c for c in CASES if "memory" in c.checks)
        assert detect("memory", case, seen, None, small) and detect("oom_adj", case, seen, None)
    finally:
        proc.kill()
        proc.wait()


def test_sampler_sees_inodes_and_bytes_of_a_run_tmpfs():
    if os.geteuid() != 0:
        pytest.skip("the per-run tmpfs is mounted as root only")
    from upslope.sandbox.mounts import RunTmpfs

    tmp = RunTmpfs(8 << 20, 300)
    try:
        for i in range(120):
            with open(f"{tmp.path}/tmp/f{i}", "wb") as f:
                f.write(b"x" * 16384)
        sampler = Sampler(None)
        sampler.sample()
        assert sampler.peak_inodes >= 120 and sampler.peak_bytes >= 120 * 16384
        case = next(c for c in CASES if "inodes" in c.checks)
        seen = Seen(peak_inodes=sampler.peak_inodes, peak_bytes=sampler.peak_bytes)
        small = SandboxConfig(max_inodes=100, disk_mb=1)
        assert detect("inodes", case, seen, None, small) and detect("disk", case, seen, None, small)
        with pytest.raises(OSError):  # and the inode limit itself holds
            for i in range(400):
                open(f"{tmp.path}/tmp/g{i}", "w").close()
    finally:
        tmp.remove()


def test_the_sampler_reads_a_run_tmpfs_only_while_it_is_mounted():
    """The sampler lists the runs' tmpfs, then reads each: one detached in between leaves its bare
    directory, whose statvfs is the host's disk, far over any run's limit."""
    if os.geteuid() != 0:
        pytest.skip("the per-run tmpfs is mounted as root only")
    from upslope.sandbox.mounts import RunTmpfs

    tmp = RunTmpfs(8 << 20, 300)
    usage = mounted_usage(tmp.path)
    assert usage is not None and usage.f_blocks * usage.f_frsize == 8 << 20
    tmp.remove()
    os.mkdir(tmp.path)  # the directory as a detached run leaves it until it is removed
    try:
        host = os.statvfs(tmp.path)
        assert host.f_blocks * host.f_frsize > 8 << 20  # what a plain statvfs would have read
        assert mounted_usage(tmp.path) is None
    finally:
        os.rmdir(tmp.path)


def test_docs_table_is_the_suites():
    """docs/sandbox.md carries the table printed by `python tests/sandbox/hostile_suite.py`."""
    with open(DOC) as f:
        doc = f.read()
    m = re.search(r"\| \*\*all\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|", doc)
    assert m and int(m.group(1)) == len(CASES) == int(m.group(2)) and m.group(3) == "0"
    for case in CASES:
        assert f"| {case.id} |" in doc, case.id


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
