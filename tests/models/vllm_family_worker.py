"""One family's vLLM check in a process of its own (vLLM hosts one engine per process):

    python vllm_family_worker.py MODEL_DIR RESULT.json [PART ...]

The sampler's log-probs against the learner's on the same tokens, before and after a large update of
every weight pushed into the engine; then, for each PART (a fragment of parameter names), after an update of
those weights alone (by at least 1 in each element, so that small tensors such as attention sinks move the
log-probs too), pushed like any other. RESULT: {"before": float, "after": float, "parts": {PART: float}}."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(model_dir: str, result_path: str, *parts: str) -> None:
    from family_checks import engine_difference, large_update, sampler_gaps

    from upslope.models import load_model, load_tokenizer
    from upslope.rollout.vllm import VLLMEngine

    tokenizer = load_tokenizer(model_dir)
    policy = load_model(model_dir, "float32").eval()
    engine = VLLMEngine(model_dir, tokenizer, dtype="float32", enforce_eager=True, kv_cache_gb=0.25, max_num_seqs=16,
                        max_model_len=256, seed=0)
    before, after = sampler_gaps(engine, policy, tokenizer, close=not parts)
    moved = {}
    prompts = [tokenizer.encode(f"Question {i}: how many legs do {i} spiders have?") for i in range(3)]
    for seed, part in enumerate(parts, start=10):
        large_update(policy, seed=seed, scale=1.0, only=part, floor=1.0)
        engine.update_weights(policy.named_parameters())
        moved[part] = engine_difference(engine, policy, prompts, seed=seed)
    if parts:
        engine.close()
    Path(result_path).write_text(json.dumps({"before": before, "after": after, "parts": moved}))


if __name__ == "__main__":
    main(*sys.argv[1:])
