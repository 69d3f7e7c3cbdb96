"""`upslope randopt`'s perturbed weights through both engines: streamed one tensor at a time into
vLLM (bf16) and the HF engine (fp32), they change what is generated, and vLLM's log-probs of its own
greedy tokens match the HF engine's teacher-forced ones under the same perturbed weights."""
from __future__ import annotations

import torch

from engine_helpers import teacher_forced_logprobs

from upslope.engine import SamplingParams
from upslope.models import load_model
from upslope.train.methods.perturb import WeightNoise


def test_vllm_follows_perturbed_weights_like_the_hf_engine(vllm_engine, hf_engine, encode_chat, tiny_model_path,
                                                          restore_weights):
    noise = WeightNoise(load_model(tiny_model_path, "float32"), seed=0)
    prompts = encode_chat(["What is 3 + 4?", "Name a colour.", "Say hi."])
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8, stop_token_ids=[2])
    before = [g[0].token_ids for g in vllm_engine.generate(prompts, greedy)]
    with restore_weights(vllm_engine), restore_weights(hf_engine):
        vllm_engine.update_weights(noise.moved(1, {0: 0.05}))
        hf_engine.update_weights(noise.moved(1, {0: 0.05}))
        after = [g[0] for g in vllm_engine.generate(prompts, greedy)]
        assert [c.token_ids for c in after] != before
        for prompt, c in zip(prompts, after):
            ref = teacher_forced_logprobs(hf_engine.model, prompt, c.token_ids, 0.0)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=0.05), (c.logprobs, ref.tolist())
