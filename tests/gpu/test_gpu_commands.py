"""Whole commands on a CUDA GPU (train with the HF, paged and vLLM engines, eval, sft, dpo, distill,
LoRA, resume from a CPU checkpoint) on a tiny random-init model. Marked `gpu`: deselected by
default, skipped without CUDA (`pytest -m gpu`). Each checks that the work ran on the GPU."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import metrics

from upslope.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOY = FIXTURES / "toy_rewards.py"
CHAT = FIXTURES / "chat.jsonl"
REPO = Path(__file__).resolve().parents[2]


def common(model: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={model}", f"run_dir={run_dir}", "log.progress=false", "log.tensorboard=false",
            "log.plot=false", "train.eval_before=false", "train.eval_after=false", "rollout.prompts_per_step=4",
            "rollout.n=4", "rollout.max_new_tokens=8", f"reward=[{{name: '{TOY}:long_text'}}]", *extra]



def hardware_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "hardware.json").read_text())


def test_train_three_steps_with_the_hf_engine_on_the_gpu(gpu_tiny_model, tmp_path):
    run = tmp_path / "train"
    assert main(["train", *common(gpu_tiny_model, run, "engine.name=hf", "train.steps=3")]) == 0
    got = metrics(run)
    assert [r["step"] for r in got] == [1, 2, 3] and all(r["rollout/engine_on_gpu"] == 1.0 for r in got)
    assert all(r["rollout/tokens_per_s"] > 0 and r["learner/tokens_per_s"] > 0 for r in got)
    assert hardware_record(run)["defaults"]["on_gpu"]


def test_train_three_steps_with_the_paged_engine_on_the_gpu(gpu_tiny_model, tmp_path):
    """Continuous batching on the GPU in fp32: the sampler's log-probs are the learner's (mismatch is
    the mean |sampler - learner| log-prob over the batch's tokens, before any update)."""
    run = tmp_path / "paged"
    assert main(["train", *common(gpu_tiny_model, run, "engine.name=hf_paged", "train.steps=3",
                                  "train.precision=float32", "model.dtype=float32", "engine.dtype=float32")]) == 0
    got = metrics(run)
    assert [r["step"] for r in got] == [1, 2, 3] and all(r["rollout/engine_on_gpu"] == 1.0 for r in got)
    assert all(r["mismatch"] < 1e-3 for r in got), [r["mismatch"] for r in got]
    assert all(r["memory/gpu_peak_gib"] > 0 for r in got)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (CUDA build) not importable")
def test_train_two_steps_with_the_vllm_engine_colocated(gpu_tiny_model, tmp_path):
    run = tmp_path / "vllm"
    assert main(["train", *common(gpu_tiny_model, run, "engine.name=vllm", "train.steps=2",
                                  "engine.gpu_memory_utilization=0.3")]) == 0
    assert all(r["rollout/engine_on_gpu"] == 1.0 for r in metrics(run))


def test_eval_on_the_gpu(gpu_tiny_model, tmp_path):
    run = tmp_path / "eval"
    assert main(["eval", *common(gpu_tiny_model, run, "engine.name=hf", "eval.limit=8")]) == 0


def test_sft_on_the_gpu(gpu_tiny_model, tmp_path):
    run = tmp_path / "sft"
    assert main(["sft", *common(gpu_tiny_model, run, f"data.path={CHAT}", "data.messages_field=messages",
                                "sft.batch_size=4", "train.steps=2")]) == 0
    assert len(metrics(run)) == 2


def test_dpo_on_policy_on_the_gpu(gpu_tiny_model, tmp_path):
    run = tmp_path / "dpo"
    assert main(["dpo", *common(gpu_tiny_model, run, "engine.name=hf", "dpo.pairs_per_step=3", "train.steps=2",
                                "rollout.max_resample_rounds=0")]) == 0


def test_distill_on_the_gpu(gpu_tiny_model, gpu_teacher_model, tmp_path):
    run = tmp_path / "distill"
    assert main(["distill", *common(gpu_tiny_model, run, "engine.name=hf", f"distill.teacher={gpu_teacher_model}",
                                    "train.steps=2")]) == 0


def test_lora_train_on_the_gpu(gpu_tiny_model, tmp_path):
    run = tmp_path / "lora"
    assert main(["train", *common(gpu_tiny_model, run, "engine.name=hf", "lora.enabled=true", "train.steps=2")]) == 0


@pytest.mark.parametrize("precision", ["bfloat16", "float32"])
def test_a_cpu_checkpoint_resumes_on_the_gpu(gpu_tiny_model, tmp_path, precision):
    """Step 1 on the CPU (a subprocess without CUDA, CPU defaults: bf16 weights and 8-bit moments
    with bf16), step 2 resumed on the GPU from that checkpoint."""
    run = tmp_path / f"resume-{precision}"
    args = common(gpu_tiny_model, run, "engine.name=hf", f"train.precision={precision}", "train.save_every=1")
    path = os.environ.get("PYTHONPATH")  # keeps packages installed beside the interpreter's (a --target dir)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": f"{REPO}:{path}" if path else str(REPO)}
    cpu = subprocess.run([sys.executable, "-m", "upslope.cli", "train", *args, "train.steps=1"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    assert not hardware_record(run)["defaults"]["on_gpu"]
    assert main(["train", *args, "train.steps=2", "train.resume=latest"]) == 0
    assert [r["step"] for r in metrics(run)] == [1, 2]
