"""Shared fixtures of the sandbox tests: real bubblewrap runs, no mocks."""
from __future__ import annotations

import pytest
from sandbox_helpers import BWRAP_PROBLEM, pids_with_uid_in

from upslope.sandbox import SandboxConfig, SandboxPool

@pytest.fixture(scope="module")
def pool():
    """A bubblewrap pool with short limits; checks that no process of it outlives the module."""
    if BWRAP_PROBLEM is not None:
        pytest.skip(f"sandbox unavailable: {BWRAP_PROBLEM}")
    p = SandboxPool(SandboxConfig(timeout_s=5.0, memory_mb=512))
    yield p
    p.close()
    assert pids_with_uid_in(p.sandbox.uid_range) == []
