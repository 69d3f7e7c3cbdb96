"""A log written to a file holds upslope's lines and real warnings, not third-party noise: the GGUF
conversion's tqdm bars (one line of thousands of characters), vLLM's FutureWarnings about
`torch.distributed.reduce_op`, "Triton is installed, but doesn't include CPU backend", the NUMA
binding warning of vLLM's C++ CPU worker, vLLM's weight-loading bar. A genuine warning of a
dependency (torch's, raised in a user's reward on every call) still shows, once; upslope's own
progress still shows in a terminal.

The commands run as a user runs them, `python -m upslope.cli ... > log 2>&1`, each with its own
home, cache (a fresh one converts the GGUF model) and run directory.
"""
from __future__ import annotations

import os
import pty
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

NOISE = ["Converting and de-quantizing GGUF tensors", "Loading weights", "Writing model shards",
         "torch.distributed.reduce_op", "Triton is installed", "NUMA binding", "Loading safetensors checkpoint shards",
         "it/s]"]
REAL_WARNING = "UserWarning: To copy construct from a tensor"
WARNING_REWARD = """
import torch

def copies(completion, answer, meta):
    torch.tensor(torch.ones(1))  # torch warns: copy-constructing from a tensor (on every call)
    return 0.0
"""
FAST = ["rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8", "eval.limit=2",
        "log.tensorboard=false", "log.plot=false", "data.options={count: 16}"]


def env_for(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), "UPSLOPE_CACHE": str(tmp_path / "cache")}


def logged(tmp_path: Path, name: str, *args: str) -> str:
    """Run `python -m upslope.cli ARGS > name.log 2>&1` (not a terminal); the log's text."""
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.run([sys.executable, "-m", "upslope.cli", *args], stdout=fh, stderr=subprocess.STDOUT,
                              env=env_for(tmp_path), cwd=tmp_path, timeout=900)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def assert_clean(text: str) -> None:
    found = [n for n in NOISE if n in text]
    assert not found, (found, text[:4000])
    # a bar's updates make a line of thousands of characters; a line naming a temporary path is
    # measured without it (how long that path is depends on where the temp dir is)
    short = text.replace(tempfile.gettempdir(), "$TMPDIR")
    assert max(map(len, short.splitlines())) < 300, "a line of a progress bar's updates"
    assert text.count(REAL_WARNING) == 1, text[:4000]


@pytest.fixture
def reward(tmp_path) -> str:
    path = tmp_path / "warning_reward.py"
    path.write_text(textwrap.dedent(WARNING_REWARD))
    return f"reward=[{{name: '{path}:copies'}}]"


@pytest.mark.ci
@pytest.mark.slow  # a training run that starts vLLM in its own process: ~50 s on 2 cores
def test_a_vllm_training_log_has_no_third_party_noise(tiny_model_path, tmp_path, reward):
    pytest.importorskip("vllm")
    text = logged(tmp_path, "train", "train", f"model.name={tiny_model_path}", "engine.name=vllm", "train.steps=1",
                  f"run_dir={tmp_path / 'run'}", reward, *FAST)
    assert "step 1:" in text
    assert_clean(text)


@pytest.mark.slow  # converts the real GGUF model (fresh cache), then starts vLLM and HF on it: ~2 min on 2 cores
def test_fresh_cache_eval_and_train_logs_have_no_third_party_noise(tmp_path, reward):
    pytest.importorskip("vllm")
    text = logged(tmp_path, "eval", "eval", "engine.name=vllm", f"run_dir={tmp_path / 'eval'}", reward, *FAST)
    assert "converting SmolLM2-135M-Instruct" in text and "pass@1" in text
    assert_clean(text)
    text = logged(tmp_path, "train", "train", "engine.name=hf", "train.steps=1", f"run_dir={tmp_path / 'run'}",
                  reward, *FAST)
    assert "step 1:" in text
    assert_clean(text)


FILTER_SCRIPT = """
import os, sys, warnings
from tqdm.auto import tqdm
from upslope.logs import quiet
from upslope.logs.quiet import GGUF_CONVERT_NOISE, VLLM_START_NOISE, filtered_stderr

quiet.install()
with filtered_stderr(GGUF_CONVERT_NOISE + VLLM_START_NOISE):
    for _ in tqdm(range(300), desc="Converting and de-quantizing GGUF tensors...", mininterval=0):
        pass
    os.write(2, b"[W1204 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0).\\n")
    os.write(2, b"a line from C that stays\\n")
    print("a Python line that stays", file=sys.stderr)
    warnings.warn("a real warning", UserWarning)
    os.write(2, b"a last line without a newline")
print("after the block", file=sys.stderr)
"""


def test_the_filter_drops_only_the_named_lines(tmp_path):
    """Within filtered_stderr, what reaches the stderr descriptor from tqdm, C (os.write) and Python is
    passed through line by line, but for the lines matching the named patterns."""
    proc = subprocess.run([sys.executable, "-c", FILTER_SCRIPT], capture_output=True, text=True, env=env_for(tmp_path),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["a line from C that stays", "a Python line that stays",
                                        "<string>:14: UserWarning: a real warning",
                                        "a last line without a newlineafter the block"], proc.stderr


@pytest.mark.ci
@pytest.mark.slow  # a training run in its own process under a terminal: ~9 s
def test_upslope_progress_still_shows_in_a_terminal(tiny_model_path, tmp_path):
    """In a terminal (a pseudo-terminal here) the evaluation's own progress bar is drawn."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "upslope.cli", "eval", f"model.name={tiny_model_path}",
                             "engine.name=hf", f"run_dir={tmp_path / 'eval'}", "eval.limit=4", "rollout.max_new_tokens=4"],
                            stdin=follower, stdout=follower, stderr=follower, env=env_for(tmp_path), cwd=tmp_path)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0, out.decode(errors="replace")[-3000:]
    assert "eval: generating" in out.decode(errors="replace")
