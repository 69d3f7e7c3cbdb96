"""What a TreeRPO / CATPO tree rollout costs an engine (HF or vLLM) against plain sampling: one step's rollout
of the headroom task (recipes/headroom.yaml prompts through its chat template) on the embedded SmolLM2-135M,
with the same number of leaves per prompt, arms interleaved, median of the repeats.

    python benchmarks/tree_sampling.py [--engine hf|vllm] [--prompts 8] [--n 8] [--tokens 8] [--repeats 3] [--threads 1]

Reported per arm: seconds per rollout call, leaf tokens/s (completion tokens of the batch the learner gets,
shared prefixes counted in every leaf) and sampled tokens/s (tokens the engine generated).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from upslope.config import load_config
from upslope.data import load_examples
from upslope.data.prompts import encode_prompts
from upslope.engine import SamplingParams
from upslope.models import load_tokenizer, resolve_model
from upslope.registry import ROLLOUTS
from upslope.rollout.hf import HFEngine
from upslope.rollout.vllm import VLLMEngine

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the engine (0: fitted to free cores)")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="the rollout engine (fp32 either way)")
    a = ap.parse_args()
    cfg = load_config(ROOT / "recipes" / "headroom.yaml", ["run_dir=/tmp/tree_sampling"])
    path = resolve_model("smollm2-135m-instruct")
    tok = load_tokenizer(path, cfg.model.chat_template)
    examples = load_examples(cfg.data, "train")[:a.prompts]
    ids, _ = encode_prompts(examples, tok)
    if a.engine == "vllm":  # its prefix cache reuses the KV of the prompt and of a tree's shared prefixes
        engine = VLLMEngine(path, tok, dtype="float32", threads=a.threads, max_model_len=512, kv_cache_gb=0.5)
    else:
        engine = HFEngine(path, tok, dtype="float32", batch_size=64, threads=a.threads)
    arms = {"plain": ROLLOUTS.bind("single_turn"),
            "tree (treerpo.yaml)": ROLLOUTS.bind("tree", {"branches": 2, "depths": [1, 2]}),
            "tree + healing (catpo.yaml)": ROLLOUTS.bind("tree", {"branches": 2, "depths": [1, 2], "heal_leaves": 2})}
    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in arms}
    for r in range(a.repeats):  # interleaved, so load from other processes hits every arm alike
        params = SamplingParams(n=a.n, max_new_tokens=a.tokens, seed=r, stop_token_ids=[tok.eos_token_id])
        for name, rollout in arms.items():
            t = time.perf_counter()
            b = rollout(engine, ids, examples, params, tok.pad_token_id)
            s = time.perf_counter() - t
            leaf = float(b.completion_lens.sum())
            sampled = sum(m.get("metrics", {}).get("tree/sampled_tokens", m["completion_tokens"]) for m in b.meta)
            runs[name].append((s, leaf, sampled))
            print(f"repeat {r} {name}: {s:.2f} s, {leaf:.0f} leaf tokens, {sampled:.0f} sampled", flush=True)
    print(f"{a.prompts} prompts x {a.n} leaves, {a.tokens} new tokens, {a.engine} engine fp32, {a.threads} thread(s), "
          f"median of {a.repeats}")
    for name, v in runs.items():
        sec = statistics.median(x[0] for x in v)
        leaf_tps = statistics.median(x[1] / x[0] for x in v)
        samp_tps = statistics.median(x[2] / x[0] for x in v)
        print(f"{name}: {sec:.2f} s/rollout (all {[round(x[0], 2) for x in v]}), leaf {leaf_tps:.0f} tokens/s, "
              f"sampled {samp_tps:.0f} tokens/s, leaf tokens {statistics.median(x[1] for x in v):.0f}, "
              f"sampled {statistics.median(x[2] for x in v):.0f}")


if __name__ == "__main__":
    main()
