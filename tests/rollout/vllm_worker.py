"""Run greedy generation with a vLLM engine in a process of its own (vLLM hosts one engine
per process, and the test session's engine runs the tiny model).

    python vllm_worker.py MODEL_DIR REQUEST.json RESULT.json

REQUEST: {"prompts": [[ids]], "max_new_tokens": int, "dtype": "bfloat16"|"float32",
          "speculative": vLLM speculative_config (optional)}
RESULT: {"tokens": [[ids]], "logprobs": [[floats]], "finish": [str], "start_s": float, "generate_s": float,
         "speculative": the speculative method vLLM runs (null: none)}
"""
from __future__ import annotations

import json
import sys
import time


def main(model_dir: str, request_path: str, result_path: str) -> None:
    from upslope.engine import SamplingParams
    from upslope.models import load_tokenizer
    from upslope.rollout.vllm import VLLMEngine

    request = json.loads(open(request_path).read())
    t0 = time.perf_counter()
    engine = VLLMEngine(model_dir, load_tokenizer(model_dir), dtype=request["dtype"], enforce_eager=True,
                        kv_cache_gb=1.0, max_num_seqs=32, max_model_len=1024, seed=0,
                        speculative=request.get("speculative"))
    running = engine.llm.llm_engine.vllm_config.speculative_config
    t1 = time.perf_counter()
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=request["max_new_tokens"],
                            stop_token_ids=request.get("stop_token_ids", [2]))
    groups = engine.generate(request["prompts"], params)
    t2 = time.perf_counter()
    engine.close()
    with open(result_path, "w") as fh:
        json.dump({"tokens": [g[0].token_ids for g in groups], "logprobs": [g[0].logprobs for g in groups],
                   "finish": [g[0].finish_reason for g in groups], "start_s": t1 - t0, "generate_s": t2 - t1,
                   "speculative": getattr(running, "method", None)}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:4])
