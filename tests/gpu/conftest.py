"""Fixtures of the GPU tests: a tiny random-init model built from a model skeleton (config and
tokenizer files, no weights), so that they run on a machine without the hub or the embedded
model. `UPSLOPE_GPU_SKELETON` names the skeleton directory (benchmarks/gpu_prepare.sh copies
one into .gpu_assets/); without it the embedded SmolLM2-135M is the source."""
from __future__ import annotations

import os

import pytest
import torch

from upslope.models import make_tiny_model, resolve_model

collect_ignore: list[str] = []


def skeleton() -> str:
    return os.environ.get("UPSLOPE_GPU_SKELETON") or resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gpu_tiny_model(tmp_path_factory) -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return make_tiny_model(skeleton(), tmp_path_factory.mktemp("gpu-tiny") / "model")


@pytest.fixture(scope="session")
def gpu_teacher_model(tmp_path_factory) -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return make_tiny_model(skeleton(), tmp_path_factory.mktemp("gpu-teacher") / "model", seed=1)
