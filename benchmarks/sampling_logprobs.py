"""What ESPO's per-token signal costs an engine: tokens/s of sampling with and without the per-token
log-probs, on the embedded SmolLM2-135M, same seed and prompts, arms interleaved. HF: `generate` with and
without `output_scores` (the processed logits of every step, from which the sampled token's log-prob and
any top-k log-probs are read). vLLM: `logprobs=None` (nothing), `0` (the sampled token's, what upslope's
engine always asks for) and `20` (top-20, what a full-distribution entropy estimate would need).

    python benchmarks/sampling_logprobs.py [--engine hf|vllm] [--prompts 32] [--tokens 32] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import torch

from upslope.models import load_model, load_tokenizer, resolve_model


def tokens_per_s(model, ids, attn, tokens: int, scores: bool, topk: int) -> float:
    """Generated tokens per second of one sampled `generate` call (plus reading top-k log-probs when asked)."""
    torch.manual_seed(0)
    t = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=tokens, min_new_tokens=tokens,
                         do_sample=True, top_k=None, output_scores=scores, return_dict_in_generate=True,
                         pad_token_id=0)
    if scores:
        lp = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        lp.gather(-1, out.sequences[:, ids.shape[1]:, None])
        if topk:
            lp.topk(topk, -1)
    return ids.shape[0] * tokens / (time.perf_counter() - t)


def vllm_tokens_per_s(llm, prompts: list[list[int]], tokens: int, logprobs: int | None) -> float:
    """Generated tokens per second of one sampled vLLM `generate` call asking for `logprobs` per token."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    torch.manual_seed(0)
    sp = SamplingParams(temperature=1.0, max_tokens=tokens, min_tokens=tokens, logprobs=logprobs)
    llm.reset_prefix_cache()  # every arm prefills its prompts itself
    t = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return len(prompts) * tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="the engine measured (fp32)")
    a = ap.parse_args()
    path = resolve_model("smollm2-135m-instruct")
    if a.engine == "vllm":
        return run_vllm(path, a)
    tok, model = load_tokenizer(path), load_model(path, "float32").eval()
    enc = tok([f"What is {i} + {2 * i + 7}?" for i in range(a.prompts)], return_tensors="pt", padding=True,
              padding_side="left")
    arms = {"plain": (False, 0), "logprob of the sampled token": (True, 0), "+ top-20 log-probs": (True, 20)}
    res: dict[str, list[float]] = {k: [] for k in arms}
    with torch.no_grad():
        for _ in range(a.repeats):  # interleaved, so load from other processes hits every arm alike
            for name, (scores, k) in arms.items():
                res[name].append(tokens_per_s(model, enc.input_ids, enc.attention_mask, a.tokens, scores, k))
    for name, v in res.items():
        print(f"{name}: {sorted(v)[len(v) // 2]:.0f} tokens/s (median of {len(v)}; all {[round(x) for x in v]})")


def run_vllm(path: str, a: argparse.Namespace) -> None:
    """The vLLM arms: no log-probs, the sampled token's, top-20, each call with an empty prefix cache."""
    from upslope.rollout.vllm import VLLMEngine

    tok = load_tokenizer(path)
    engine = VLLMEngine(path, tok, dtype="float32", threads=1, max_model_len=512, kv_cache_gb=0.5)
    prompts = [tok(f"What is {i} + {2 * i + 7}?").input_ids for i in range(a.prompts)]
    arms = {"no log-probs": None, "logprob of the sampled token": 0, "+ top-20 log-probs": 20}
    res: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(a.repeats):
        for name, k in arms.items():
            res[name].append(vllm_tokens_per_s(engine.llm, prompts, a.tokens, k))
    for name, v in res.items():
        print(f"vllm {name}: {sorted(v)[len(v) // 2]:.0f} tokens/s (median of {len(v)}; all {[round(x) for x in v]})")


if __name__ == "__main__":
    main()
