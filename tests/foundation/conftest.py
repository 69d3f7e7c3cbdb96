"""Foundation-suite settings. Shared fixtures (models, tokenizer, engines) are in tests/conftest.py."""
from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def torch_threads():
    """Run the foundation tests with UPSLOPE_TEST_THREADS torch threads (default 1).

    Measured on the shared 2-core machine under load from other jobs (load average 6-7):
    greedy HF generation with SmolLM2-135M (6 prompts, 10 tokens) took 24-26 s with 2
    threads and 4.1-4.5 s with 1 (OpenMP threads spin-waiting on descheduled peers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("UPSLOPE_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(before)
