"""The run's memory limit holds for all its processes together, on this host's cgroups (v2, or v1
beside an empty v2 `unified` mount as on this project's machines): six processes of 900 MiB under
memory_mb=1024 (so 2048 MiB for the run) cannot hold more than the run's limit."""
from __future__ import annotations

import json
import os

import pytest
from sandbox_helpers import needs_bwrap

import upslope.sandbox.cgroup as cgroup
from upslope.sandbox import Job, Sandbox, SandboxConfig

pytestmark = needs_bwrap

SIX_OF_900 = """
import json, os, time
kids = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        try:
            b = bytearray(900 << 20)
            for i in range(0, len(b), 4096): b[i] = 1
        except MemoryError:
            os._exit(3)
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
print(json.dumps([os.waitpid(k, 0)[1] for k in kids]))
"""


def test_six_processes_of_900_mib_hold_at_most_the_runs_memory(monkeypatch):
    sandbox = Sandbox(SandboxConfig(memory_mb=1024, timeout_s=30))
    if sandbox.cgroups is None:
        pytest.skip(f"no per-run cgroup here ({sandbox.cgroup_problem}): see test_as_an_ordinary_user for that path")
    seen: list[tuple[int, bool]] = []
    remove = cgroup.RunGroup.remove

    def observed(group: cgroup.RunGroup) -> None:  # read the kernel's figures before the group goes
        seen.append((group.peak_bytes(), group.oom_killed()))
        remove(group)

    monkeypatch.setattr(cgroup.RunGroup, "remove", observed)
    res = sandbox.run(Job(code=SIX_OF_900))
    assert res.status == "ok" and res.limits == f"cgroup v{sandbox.cgroups.version}", res.stderr or res.error
    statuses = json.loads(res.stdout)
    survived = sum(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses)
    assert survived <= 2, statuses  # three of 900 MiB do not fit in 2048 MiB
    [(peak, oom_killed)] = seen
    assert 0 < peak <= sandbox.config.run_memory_bytes, peak >> 20
    assert oom_killed or survived + sum(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 3 for s in statuses) == 6
