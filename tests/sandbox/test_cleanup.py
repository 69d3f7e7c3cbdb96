"""A trainer killed in the middle of a run leaves its run's tmpfs mount and cgroups; the
next sandbox made on the host removes them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hermetic import ROOT
from sandbox_helpers import needs_bwrap, run_mounts

from upslope.sandbox import Sandbox, SandboxConfig

pytestmark = needs_bwrap

CHILD = """
from upslope.sandbox import Job, Sandbox
sb = Sandbox()
print(sb.cgroups is not None, flush=True)
sb.run(Job(code="import time\\ntime.sleep(60)", timeout_s=60))
"""


def _groups_of(pid: int) -> list[str]:
    roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"]
    return [os.path.join(r, f"upslope-sandbox-{pid}") for r in roots if os.path.isdir(os.path.join(r, f"upslope-sandbox-{pid}"))]


def test_a_killed_trainers_mount_and_cgroups_are_swept():
    if os.geteuid() != 0:
        pytest.skip("the per-run tmpfs and cgroups are made as root only")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    has_cgroups = child.stdout.readline().strip() == "True"
    for _ in range(100):
        if run_mounts(child.pid):
            break
        time.sleep(0.05)
    assert run_mounts(child.pid), "the run's tmpfs was not mounted"
    assert bool(_groups_of(child.pid)) == has_cgroups
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    time.sleep(0.2)
    assert run_mounts(child.pid)  # left behind: nobody could clean up
    Sandbox(SandboxConfig())  # the next sandbox on the host sweeps what dead ones left
    from upslope.sandbox import cgroup

    cgroup.sweep_stale()  # (available() ran it once per process already)
    assert run_mounts(child.pid) == [] and _groups_of(child.pid) == []
