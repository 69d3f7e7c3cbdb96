"""Peak memory and time of one learner step: full fp32 logits over every position versus
upslope's chunked LM head at completion positions only.

Each variant runs in a fresh subprocess (peak RSS = the process's max RSS), on the embedded
SmolLM2-135M with a synthetic batch (default 32 rows x 192 tokens: 38 prompt + 154
completion tokens), bf16 autocast, forward + backward (no optimiser step, so the difference
is the logits and what the head keeps for backward).

    python benchmarks/learner_memory.py [--rows 32] [--prompt 38] [--completion 154]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

VARIANTS = ("full_fp32_logits", "chunked_completion_only", "chunked_shared_prompt")


def worker(variant: str, rows: int, prompt: int, completion: int) -> dict:
    import torch

    from upslope.batch import build_batch
    from upslope.models import load_model, resolve_model
    from upslope.train.learner.logprobs import token_logprobs, token_logprobs_shared_prompt

    torch.manual_seed(0)
    model = load_model(resolve_model("smollm2-135m-instruct", announce=lambda m: None), "float32")
    group = 4
    prompts, comps, gids = [], [], []
    for i in range(rows):
        if i % group == 0:
            p = torch.randint(5, 40000, (prompt,)).tolist()
        prompts.append(p)
        comps.append(torch.randint(5, 40000, (completion,)).tolist())
        gids.append(i // group)
    b = build_batch(prompts, comps, [[0.0] * completion] * rows, gids, [False] * rows, pad_id=2)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if variant == "full_fp32_logits":
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits.float()
            lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
            lp = torch.cat([torch.zeros(rows, 1), lp], 1)
        elif variant == "chunked_completion_only":
            lp, _ = token_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask, chunk_rows=1024)
        else:
            lp, _ = token_logprobs_shared_prompt(model, b.input_ids, b.attention_mask, b.loss_mask, b.prompt_lens,
                                                 b.seq_lens, b.group_ids, chunk_rows=1024)
    loss = -(lp * b.loss_mask).sum() / b.loss_mask.sum()
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "seconds": round(seconds, 2), "peak_rss_gib": round(peak / 2**20, 2),
            "step_rss_gib": round((peak - base_rss) / 2**20, 2),
            "logits_fp32_gib": round(rows * (prompt + completion) * model.config.vocab_size * 4 / 2**30, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=38)
    ap.add_argument("--completion", type=int, default=154)
    ap.add_argument("--worker", choices=VARIANTS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.rows, a.prompt, a.completion)))
        return
    results = []
    for v in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--worker", v, "--rows", str(a.rows), "--prompt", str(a.prompt),
                              "--completion", str(a.completion)], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'variant':26} {'fwd+bwd s':>10} {'peak RSS GiB':>13} {'step RSS GiB':>13}")
    for r in results:
        print(f"{r['variant']:26} {r['seconds']:>10.2f} {r['peak_rss_gib']:>13.2f} {r['step_rss_gib']:>13.2f}")
    print(f"one fp32 [batch, time, vocab] logits tensor here: {results[0]['logits_fp32_gib']:.2f} GiB")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
