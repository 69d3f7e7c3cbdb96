"""Learner FLOP/s against this machine's matmul peak.

Peak: the best of a few timed `torch.mm` of two square matrices (2048 on CPU, 8192 on GPU),
fp32 and bf16, with the learner's thread count (2 on this CPU machine by default).
Achieved: 6 x parameters x forwarded tokens / learner time, where forwarded tokens are all
the tokens the learner runs through the model in one update (with `train.share_prompt`
each group's prompt once plus every completion; without it every prompt + completion
row), and the learner time is one `Updater.update` (forward, backward, AdamW step) on
a synthetic batch with non-zero advantages. The 6N rule ignores attention FLOPs and
counts the LM head at prompt positions, where upslope skips it: read the fraction as an
approximation.

Shapes: `bench` = the GRPO benchmark (8 prompts x 4 completions, 38-token prompts as the
chat-templated arith prompts are, 32 new tokens); `long` = 512-token completions (4 prompts x 4 by default). Every combination of
precision (fp32; bf16 = upslope's default bf16 weights, gradients and moments; bf16-mixed = fp32
master weights under bf16 autocast) and `train.share_prompt` (true, false) runs in turn.

Usage:
  nice -n 19 python benchmarks/learner_mfu.py                      # CPU, SmolLM2-135M
  python benchmarks/learner_mfu.py --device cuda --random-init-params 0.5e9
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent
# learner precision cells: their overrides, and the matmul peak each is measured against
PRECISIONS = {"fp32": (["train.precision=float32"], "fp32"),
              "bf16": (["train.precision=bfloat16"], "bf16"),  # upslope's default: bf16 weights, grads, moments
              "bf16-mixed": (["train.precision=bfloat16", "model.dtype=float32"], "bf16")}  # fp32 master + autocast


# ---------------------------------------------------------------- peak


def matmul_peak(device: str, dtype_name: str, size: int, repeats: int) -> dict[str, float]:
    """Best FLOP/s of `torch.mm(size x size, size x size)` over `repeats` timed calls."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    inner = 20 if device == "cuda" else 1  # GPU: several mm per timing, a single one is microseconds
    for _ in range(2):
        torch.mm(a, b)
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b)
        sync()
        times.append((time.perf_counter() - t) / inner)
    flops = 2.0 * size ** 3
    return {"best_flops": flops / min(times), "median_flops": flops / statistics.median(times), "size": size}


# ---------------------------------------------------------------- model


def random_llama(params: float, target_dir: Path, seed: int = 0) -> str:
    """A randomly initialised Llama-style model of about `params` parameters (no hub):
    hidden 1024, 16 heads of 64, 4 KV heads, MLP 2816, vocab 49152, tied embeddings; the
    number of layers sets the size. Saved once under `target_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, vocab, heads, kv = 1024, 2816, 49152, 16, 4
    head_dim = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv * head_dim + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((params - vocab * hidden) / per_layer))
    path = target_dir / f"random-llama-{layers}l"
    if (path / "config.json").exists():
        return str(path)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
                      max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                      pad_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


def model_path_for(a: argparse.Namespace) -> str:
    if a.random_init_params:
        root = Path(a.random_dir) if a.random_dir else Path(tempfile.gettempdir()) / "upslope-bench-models"
        return random_llama(a.random_init_params, root)
    if a.model:
        return a.model
    from upslope.models import resolve_model

    return resolve_model("smollm2-135m-instruct", announce=lambda m: print(m, file=sys.stderr))


# ---------------------------------------------------------------- one cell


def synthetic_batch(prompts: int, n: int, prompt_tokens: int, new_tokens: int, vocab: int, pad_id: int,
                    seed: int) -> Any:
    """`prompts` groups of `n` samples: one random prompt per group, full-length random
    completions, random sampler log-probs and non-zero advantages."""
    import torch

    from upslope.batch import build_batch

    gen = torch.Generator().manual_seed(seed)
    hi = min(vocab, 49152)
    p_ids, c_ids, c_lps, gids = [], [], [], []
    for g in range(prompts):
        prompt = torch.randint(3, hi, (prompt_tokens,), generator=gen).tolist()
        for _ in range(n):
            p_ids.append(prompt)
            c_ids.append(torch.randint(3, hi, (new_tokens,), generator=gen).tolist())
            c_lps.append((-torch.rand(new_tokens, generator=gen) * 3).tolist())
            gids.append(g)
    batch = build_batch(p_ids, c_ids, c_lps, gids, [True] * len(p_ids), pad_id)
    adv = torch.randn(len(p_ids), 1, generator=gen).expand_as(batch.loss_mask)
    batch.advantages = adv * batch.loss_mask
    return batch


def forwarded_tokens(batch: Any, share_prompt: bool) -> int:
    """Tokens the learner runs through the model: each group's prompt once plus every
    completion when the prompt is shared, else every row's prompt + completion."""
    if not share_prompt:
        return int(batch.seq_lens.sum())
    groups = batch.group_ids.unique()
    prompt = sum(int(batch.prompt_lens[batch.group_ids == g][0]) for g in groups)
    return prompt + int(batch.completion_lens.sum())


def run_cell(a: argparse.Namespace, model_path: str, shape: str, precision: str, share: bool) -> dict[str, Any]:
    import torch

    from upslope.config import load_config
    from upslope.train.learner.objectives import RLObjective
    from upslope.train.learner.updater import Updater

    prompts, n, plen, clen = ((a.bench_prompts, a.bench_n, a.bench_prompt_tokens, a.bench_new_tokens) if shape == "bench"
                              else (a.long_prompts, a.long_n, a.long_prompt_tokens, a.long_new_tokens))
    cfg = load_config(None, [f"model.name={model_path}", *PRECISIONS[precision][0],
                             f"train.share_prompt={str(share).lower()}", f"rollout.max_new_tokens={clen}",
                             f"rollout.prompts_per_step={prompts}", f"rollout.n={n}", "algo.kl_coef=0",
                             f"train.steps={a.steps + a.warmup}", *(a.override or [])])
    learner = Updater.from_config(cfg, model_path, device=a.device)
    objective = RLObjective.from_config(cfg)
    params = sum(p.numel() for p in learner.model.parameters())
    vocab = learner.model.config.vocab_size
    batch = synthetic_batch(prompts, n, plen, clen, vocab, pad_id=2, seed=a.seed)
    tokens = forwarded_tokens(batch, learner.share_prompt)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(1, a.warmup + a.steps + 1):
        sync()
        t = time.perf_counter()
        learner.update(batch, step, objective)
        sync()
        if step > a.warmup:
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    out = {"shape": shape, "precision": precision, "share_prompt": share,
           "share_prompt_effective": learner.share_prompt, "samples": prompts * n, "prompt_tokens": plen,
           "new_tokens": clen, "params": params, "forwarded_tokens": tokens,
           "trained_tokens": int(batch.loss_mask.sum()), "s_per_update": benchlib.summary(times),
           "tokens_per_s": tokens / med, "flops_per_s": 6.0 * params * tokens / med,
           "micro_batch_tokens": cfg.train.micro_batch_tokens}
    if a.device == "cuda":
        out["cuda_peak_gib"] = torch.cuda.max_memory_allocated() / benchlib.GIB
    del learner, batch
    gc.collect()
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (also read by benchmarks/gpu_check.py, which runs chosen cells)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch threads on CPU (default 2, this machine's cores)")
    p.add_argument("--model", help="model directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--random-init-params", type=float, default=None,
                   help="instead: a randomly initialised Llama-style model of about this many parameters, e.g. 0.5e9")
    p.add_argument("--random-dir", help="where the random model is saved (default: the system temp dir)")
    p.add_argument("--shapes", default="bench,long", help="comma list of: bench, long")
    p.add_argument("--precisions", default="fp32,bf16,bf16-mixed",
                   help="comma list of: fp32, bf16 (bf16 weights/grads/moments), bf16-mixed (fp32 master + autocast)")
    p.add_argument("--share-prompt", default="true,false", help="comma list of: true, false")
    p.add_argument("--steps", type=int, default=3, help="timed updates per cell (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    p.add_argument("--bench-prompts", type=int, default=8)
    p.add_argument("--bench-n", type=int, default=4)
    p.add_argument("--bench-prompt-tokens", type=int, default=38,
                   help="38: the benchmark's arith prompts with the chat template")
    p.add_argument("--bench-new-tokens", type=int, default=32)
    p.add_argument("--long-prompts", type=int, default=4)
    p.add_argument("--long-n", type=int, default=4)
    p.add_argument("--long-prompt-tokens", type=int, default=38)
    p.add_argument("--long-new-tokens", type=int, default=512)
    p.add_argument("--mm-size", type=int, default=None, help="peak matmul size (default 2048 CPU, 8192 GPU)")
    p.add_argument("--mm-repeats", type=int, default=5)
    p.add_argument("--override", action="append", help="extra upslope key=value for the learner (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="result JSON path (default benchmarks/results/learner_mfu-<device>-<time>.json)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    import torch
    from rich.table import Table

    console = benchlib.console()
    if a.device == "cuda" and not torch.cuda.is_available():
        console.print("[yellow]--device cuda: CUDA is not available on this machine; skipping.[/yellow]")
        return 0
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    size = a.mm_size or (8192 if a.device == "cuda" else 2048)
    precisions = [x for x in a.precisions.split(",") if x]
    peaks = {}
    for kind in sorted({PRECISIONS[p][1] for p in precisions}):
        peaks[kind] = matmul_peak(a.device, kind, size, a.mm_repeats)
        console.print(f"matmul peak {kind} ({size}x{size}, {torch.get_num_threads()} threads): "
                      f"{peaks[kind]['best_flops'] / 1e9:,.0f} GFLOP/s best, "
                      f"{peaks[kind]['median_flops'] / 1e9:,.0f} median")
    peaks.update({p: peaks[PRECISIONS[p][1]] for p in precisions})
    model_path = model_path_for(a)
    console.print(f"[dim]model: {model_path}[/dim]")
    cells = []
    for shape in [s for s in a.shapes.split(",") if s]:
        for prec in precisions:
            for share in [s.strip().lower() == "true" for s in a.share_prompt.split(",") if s]:
                t = time.perf_counter()
                cell = run_cell(a, model_path, shape, prec, share)
                cell["fraction_of_peak"] = cell["flops_per_s"] / peaks[prec]["best_flops"]
                cells.append(cell)
                console.print(f"  {shape} {prec} share_prompt={share}: {cell['tokens_per_s']:.0f} tokens/s, "
                              f"{cell['flops_per_s'] / 1e9:,.0f} GFLOP/s = {cell['fraction_of_peak']:.0%} of peak "
                              f"[dim]({time.perf_counter() - t:.0f} s)[/dim]")
    tab = Table(title=f"learner FLOP/s on {a.device} ({cells[0]['params'] / 1e6:.0f}M params; "
                      f"6 x params x forwarded tokens / update time)" if cells else "learner")
    for col in ("shape", "precision", "share_prompt", "samples", "fwd tokens", "s/update", "tokens/s",
                "GFLOP/s", "peak GFLOP/s", "of peak"):
        tab.add_column(col, justify="left" if col in ("shape", "precision") else "right")
    for c in cells:
        tab.add_row(c["shape"], c["precision"], str(c["share_prompt_effective"]), str(c["samples"]),
                    str(c["forwarded_tokens"]), benchlib.fmt(c["s_per_update"]["median"]),
                    f"{c['tokens_per_s']:.0f}", f"{c['flops_per_s'] / 1e9:,.0f}",
                    f"{peaks[c['precision']]['best_flops'] / 1e9:,.0f}", f"{c['fraction_of_peak']:.1%}")
    console.print(tab)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(a.out) if a.out else HERE / "results" / f"learner_mfu-{a.device}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "learner_mfu", "machine": benchlib.machine_info(),
                               "config": vars(a), "threads": torch.get_num_threads(), "model": model_path,
                               "peaks": peaks, "cells": cells}, indent=1, default=str))
    console.print(f"[dim]wrote {out}[/dim]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
