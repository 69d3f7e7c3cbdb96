"""Run untrusted generated code: bubblewrap isolation, resource limits, a bounded pool.

    from upslope.sandbox import Job, SandboxPool
    with SandboxPool() as pool:
        [res] = pool.run_many([Job(code="print(1 + 1)")])
        res.status, res.stdout      # (Status.OK, "2\\n")

See docs/sandbox.md for what is isolated and what is not.
"""
from upslope.sandbox.functest import FunctionTest, Verdict
from upslope.sandbox.pool import SandboxPool
from upslope.sandbox.runner import HINT, Sandbox, bwrap_problem
from upslope.sandbox.types import Job, Result, SandboxConfig, Status, default_workers

__all__ = [
    "HINT",
    "FunctionTest",
    "Job",
    "Result",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "Status",
    "Verdict",
    "bwrap_problem",
    "default_workers",
]
