"""`model.trust_remote_code` reaches everything that loads the model: a model directory whose architecture
is its own Python code (config.json's auto_map) trains with it set, through the tokenizer, the learner and
the engine; without it the run stops with one line before any work."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "fixtures" / "toy_rewards.py"

CONFIG_CODE = '''from transformers import LlamaConfig


class OwnConfig(LlamaConfig):
    model_type = "own_llama"
'''
MODEL_CODE = '''from transformers import LlamaForCausalLM

from .configuration_own import OwnConfig


class OwnForCausalLM(LlamaForCausalLM):
    config_class = OwnConfig
'''


def own_code_model(tiny_model_path: str, target: Path) -> Path:
    shutil.copytree(tiny_model_path, target)
    (target / "configuration_own.py").write_text(CONFIG_CODE)
    (target / "modeling_own.py").write_text(MODEL_CODE)
    config = json.loads((target / "config.json").read_text())
    config.update(model_type="own_llama", architectures=["OwnForCausalLM"],
                  auto_map={"AutoConfig": "configuration_own.OwnConfig",
                            "AutoModelForCausalLM": "modeling_own.OwnForCausalLM"})
    (target / "config.json").write_text(json.dumps(config))
    return target


def train(model: Path, run: Path, home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(home / "hf"), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "upslope.cli", "train", f"model.name={model}", "engine.name=hf",
                           f"run_dir={run}", "train.steps=1", "train.eval_before=false", "train.eval_after=false",
                           "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4", "log.progress=false",
                           "log.plot=false", "log.tensorboard=false", f"reward=[{{name: '{TOY}:long_text'}}]", *extra],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.ci
@pytest.mark.slow  # a training run in its own process: ~14 s
def test_a_model_with_its_own_code_trains_with_trust_remote_code(tiny_model_path, tmp_path):
    model = own_code_model(tiny_model_path, tmp_path / "own")
    refused = train(model, tmp_path / "refused", tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr[-2000:]
    assert "trust_remote_code" in refused.stderr
    done = train(model, tmp_path / "run", tmp_path, "model.trust_remote_code=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"step"') == 1
