"""What ESPO's per-token signal costs the HF engine: tokens/s of `generate` with and without
`output_scores` (the processed logits of every step, from which the sampled token's log-prob and any
top-k log-probs are read), on the embedded SmolLM2-135M, same seed and prompts.

    python benchmarks/sampling_logprobs.py [--prompts 32] [--tokens 32] [--repeats 3]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    path = resolve_model("smollm2-135m-instruct")
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


if __name__ == "__main__":
    main()
