"""Vision-language checkpoints that transformers has no causal-LM class for (Mistral 3, as Mistral Small 3.x
ships; Qwen2.5-VL), trained on text alone: tiny random-init checkpoints built from configs (a one-layer
vision tower beside the family matrix's decoder) load through their image-text-to-text class; the learner's
log-probs equal the model's own forward in every learner mode; LoRA's automatic targets are the language
decoder's projections, not the vision tower's; the HF engine samples what the learner scores before and
after a large update."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from family_checks import MODES, forward_difference, sampler_gaps

from upslope import lora
from upslope.families import family_config
from upslope.models import load_model, load_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)


def mistral3(tokenizer: object) -> object:
    import transformers

    text = {**family_config("mistral", tokenizer).to_dict(), "model_type": "mistral"}
    return transformers.Mistral3Config(text_config=text, vision_config={**VISION, "head_dim": 16},
                                       image_token_index=len(tokenizer) - 1)


def qwen2_5_vl(tokenizer: object) -> object:
    import transformers

    text = {**family_config("qwen2", tokenizer).to_dict(), "model_type": "qwen2_5_vl_text",
            "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0}}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=len(tokenizer) - 1)


CONFIGS = {"mistral3": mistral3, "qwen2_5_vl": qwen2_5_vl}


@pytest.fixture(scope="module")
def vlm_path(smollm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("vision-language")

    def build(name: str) -> str:
        from transformers import AutoModelForImageTextToText

        target = root / name
        if not target.exists():
            tokenizer = load_tokenizer(smollm_path)
            torch.manual_seed(0)
            model = AutoModelForImageTextToText.from_config(CONFIGS[name](tokenizer), dtype=torch.float32)
            model.save_pretrained(target)
            tokenizer.save_pretrained(target)
        return str(target)
    return build


@pytest.mark.parametrize("name", ["mistral3", pytest.param("qwen2_5_vl", marks=pytest.mark.slow)])
def test_a_vision_language_checkpoint_trains_on_text(name, vlm_path):
    from upslope.rollout.hf import HFEngine
    from upslope.train.learner.logprobs import fast_head_matches

    path = vlm_path(name)
    model = load_model(path, "float32").eval()
    assert type(model).__name__.endswith("ForConditionalGeneration")
    assert fast_head_matches(model)
    for mode in MODES:
        lp, ent = forward_difference(model, mode)
        assert lp < 5e-5 and ent < 5e-4, (mode, lp, ent)
    targets = lora.resolve_targets(model, "auto")
    adapted = [n for n in lora.linear_layers(model) if n.rpartition(".")[2] in targets]
    assert adapted and not [n for n in adapted if "vision" in n or "visual" in n or "projector" in n], adapted
    assert all(n.startswith("model.language_model.") for n in lora.linear_layers(model))
    tokenizer = load_tokenizer(path)
    engine = HFEngine(path, tokenizer, dtype="float32")
    before, after = sampler_gaps(engine, model, tokenizer)
    assert before < 5e-4 and after < 5e-4, (before, after)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torchvision") is not None,
                    reason="needs vllm without torchvision")
def test_vllm_refuses_a_vision_language_checkpoint_without_torchvision(vlm_path):
    """vLLM's vision-language classes import torchvision: without it, one line before any work (auto then
    takes the hf engine) instead of vLLM's failed inspection."""
    from upslope.rollout.vllm import vllm_model_check

    reason = vllm_model_check(vlm_path("mistral3"))
    assert reason is not None and "torchvision" in reason and "\n" not in reason, reason
