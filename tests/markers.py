"""Marker sets shared by test modules (imported by module name: tests/ is on sys.path)."""
from __future__ import annotations

import pytest

# a test kept out of the default run for its time, which CI still runs (-m "slow and ci")
IN_CI_SLOW_SET = [pytest.mark.slow, pytest.mark.ci]

# vLLM started in the test process takes 20-40 s on a CPU: its tests run in CI's slow set, not in the default
# run (conftest.py gives these markers to every test that takes the `vllm_engine` fixture)
VLLM_IN_PROCESS = IN_CI_SLOW_SET
