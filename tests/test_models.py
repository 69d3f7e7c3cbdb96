"""Model resolution (embedded SmolLM2, local directories, hub ids offline), loading, stop
tokens and the tiny test model."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from upslope.errors import ModelError
from upslope.models import load_model, load_tokenizer, make_tiny_model, resolve_model, stop_token_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_embedded_model_is_converted_and_cached(smollm_path):
    path = Path(smollm_path)
    assert path.name == "smollm2-135m-instruct" and path.parent.name == "models"
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert "quantization_config" not in cfg  # saved as plain (dequantized) weights
    messages = []
    assert resolve_model("smollm2-135m-instruct", announce=messages.append) == smollm_path
    assert messages == []  # cached: no second conversion


def test_resolve_local_directory_returns_it(tiny_model_path):
    assert resolve_model(tiny_model_path) == tiny_model_path


def test_resolve_nonexistent_path_is_one_line_error(tmp_path):
    for name in (str(tmp_path / "no-such-model"), "./no-such-model-dir", "~/no-such-model-dir"):
        with pytest.raises(ModelError) as info:
            resolve_model(name)
        msg = str(info.value)
        assert msg == f"model.name={name}: not a model directory or .gguf file"
        assert "\n" not in msg


def test_resolve_directory_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="directory has no config.json$"):
        resolve_model(str(tmp_path / "empty"))
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.gguf").write_bytes(b"")
    (tmp_path / "two" / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelError, match="2 GGUF files: set model.gguf_file"):
        resolve_model(str(tmp_path / "two"))


def test_unreachable_hub_id_is_fast_one_line_error():
    # Measured here (no route to the hub): 0.04 s, the request fails at once, so HF_HUB_OFFLINE
    # is not needed (and setting it in-process would be too late: huggingface_hub reads it at
    # import). Where the hub is reachable, an unknown repository is answered at once too.
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        resolve_model("someorg/some-model-that-does-not-exist")
    elapsed = time.perf_counter() - start
    msg = str(info.value)
    assert msg.startswith("model.name=someorg/some-model-that-does-not-exist: not a local path")
    assert "pass model.name=/path/to/model_dir" in msg and "\n" not in msg
    assert elapsed < 20, f"hub lookup took {elapsed:.1f} s"


def test_load_model_errors_are_model_errors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="could not be loaded"):
        load_model(str(tmp_path))


def test_tokenizer_and_stop_tokens(smollm_path, tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == tokenizer.eos_token_id == 2
    assert "<|im_start|>" in tokenizer.chat_template
    assert stop_token_ids(tokenizer, smollm_path) == [2]
    custom = load_tokenizer(smollm_path, chat_template="{{ messages[0]['content'] }}!")
    assert custom.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi!"


def test_make_tiny_model(tiny_model_path, smollm_path, tmp_path):
    model = load_model(tiny_model_path)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads) == (2, 128, 64, 2)
    assert cfg.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) < 8_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    tok = load_tokenizer(tiny_model_path)
    ids = tok("What is 2 * 3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 49152) and torch.isfinite(logits).all()
    # rebuilding into an existing directory keeps it; same seed -> same weights
    assert make_tiny_model(smollm_path, tiny_model_path) == tiny_model_path
    other = make_tiny_model(smollm_path, tmp_path / "again")
    a, b = load_model(other).state_dict(), model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
    shutil.rmtree(other)


def test_a_tokenizer_loaded_again_is_a_fresh_copy_until_its_files_change(tiny_model_path, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_path, model_dir)
    first = load_tokenizer(str(model_dir))
    first.chat_template = "changed by the caller"
    first.add_tokens(["<caller-token>"])
    second = load_tokenizer(str(model_dir))
    assert second is not first and "<|im_start|>" in second.chat_template
    assert len(second) == len(first) - 1 and second("What is 2 * 3?") == load_tokenizer(str(model_dir))("What is 2 * 3?")
    templated = load_tokenizer(str(model_dir), chat_template="{{ messages[0]['content'] }}?")
    assert templated.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi?"
    assert "<|im_start|>" in load_tokenizer(str(model_dir)).chat_template  # the option is not kept
    (model_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    edited = load_tokenizer(str(model_dir))
    assert edited.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi!"
