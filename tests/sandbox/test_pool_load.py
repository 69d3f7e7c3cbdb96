"""The pool under load: hundreds of short programs, mixed outcomes, nothing leaked."""
import asyncio
import time
from collections import Counter

import pytest

from sandbox_helpers import needs_bwrap, pids_with_uid_in

from upslope.sandbox import Job, SandboxConfig, SandboxPool, Status

pytestmark = needs_bwrap


@pytest.mark.slow  # about 30 s; test_a_hung_program_does_not_stall_the_batch stays in the default run
def test_500_programs_with_passes_failures_and_timeouts():
    jobs, expected = [], []
    for i in range(500):
        kind = i % 25
        if kind == 0:  # 20 hangs, cut at half a second
            jobs.append(Job(code=f"import time\ntime.sleep(60)  # {i}", timeout_s=0.5))
            expected.append((Status.TIMEOUT, ""))
        elif kind % 3 == 0:  # failures with their own exit codes
            jobs.append(Job(code=f"print({i})\nraise SystemExit({i % 7 + 1})"))
            expected.append((Status.FAILED, f"{i}\n"))
        else:
            jobs.append(Job(code="import sys\nprint(int(sys.stdin.read()) * 2)", stdin=str(i)))
            expected.append((Status.OK, f"{2 * i}\n"))
    with SandboxPool(SandboxConfig(timeout_s=10)) as pool:
        start = time.monotonic()
        results = pool.run_many(jobs)
        elapsed = time.monotonic() - start
        uids = pool.sandbox.uid_range
    assert [(r.status, r.stdout) for r in results] == expected
    for job, r in zip(jobs, results):
        if r.status is Status.FAILED:
            assert r.exit_code == int(job.code.split("SystemExit(")[1].split(")")[0])
    counts = Counter(r.status for r in results)
    assert counts == {Status.OK: 320, Status.FAILED: 160, Status.TIMEOUT: 20}
    assert pids_with_uid_in(uids) == []
    print(f"500 programs in {elapsed:.1f} s ({500 / elapsed:.0f}/s) with {pool.workers} workers")


@pytest.mark.ci
@pytest.mark.slow  # waits out a 10 s limit
def test_a_hung_program_does_not_stall_the_batch():
    """With one worker held by a hang, the other keeps serving: the short programs all
    finish before the hang reaches its limit (10 s, so that a loaded machine
    still runs four short programs in that time)."""
    done: dict[str, float] = {}

    async def timed(pool, name, job):
        res = await pool.run_async(job)
        done[name] = time.monotonic()
        return res

    async def main(pool):
        jobs = [timed(pool, "hang", Job(code="while True: pass", timeout_s=10))]
        jobs += [timed(pool, f"short{i}", Job(code=f"print({i})")) for i in range(4)]
        return await asyncio.gather(*jobs)

    with SandboxPool(SandboxConfig(timeout_s=10), workers=2) as pool:
        results = asyncio.run(main(pool))
    assert results[0].status is Status.TIMEOUT
    assert [r.stdout for r in results[1:]] == [f"{i}\n" for i in range(4)]
    assert max(t for name, t in done.items() if name != "hang") < done["hang"]
