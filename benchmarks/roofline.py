"""Rollout and learner throughput against this machine's compute bound, at reply lengths 8, 128 and 512.

For each reply length (prompts: GSM8K test questions through the chat template) and each engine, one
rollout of `--prompts` x `--n` samples runs to its full length (the stop token is ignored, so every
reply has the length asked for), and one learner update runs on that batch. Each is reported next to
its bound: the FLOPs the work needs divided by the matmul rate measured in the same run, with the same
thread count and precision:
- rollout: 2 x parameters per generated token, plus each prompt's prefill once (its samples share it,
  as vLLM's prefix cache does) and the attention over the context (2 x 2 x layers x hidden per cached token);
- learner: 6 x parameters per forwarded token (a shared prompt once per group; 8 x with per-layer
  checkpointing, which runs each layer's forward again in backward), plus attention likewise.
With `--mixed` the learner's replies have mixed lengths (one per group at the full length, the others
at 1/16..1/4 of it), where padding shows; `--override train.packing=true` runs packed micro-batches.
The fraction is bound time / measured time: 1.0 is the machine's matmul rate on every FLOP.

Each engine cell runs in a fresh process (vLLM hosts one engine per process); the learner cell too.

Usage:
  python benchmarks/roofline.py                                  # lengths 8,128,512, engines vllm,hf,hf_paged
  python benchmarks/roofline.py --engines vllm,vllm_ngram        # vLLM with and without n-gram speculation
  python benchmarks/roofline.py --lengths 8 --engines hf --prompts 2 --n 2   # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent


def model_shape(model_path: str) -> dict[str, int]:
    """Parameters, layers and hidden size of the model (what the FLOP counts need)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    from upslope.models import load_model

    model = load_model(model_path, "float32", empty=True)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "layers": config["num_hidden_layers"], "hidden": config["hidden_size"]}


def attention_flops(shape: dict[str, int], prompt: int, reply: int) -> float:
    """Attention's score and value products over one sequence: each token attends to those before it."""
    total = prompt + reply
    return 2.0 * 2 * shape["layers"] * shape["hidden"] * total * (total + 1) / 2


def rollout_flops(shape: dict[str, int], prompt: int, reply: int, prompts: int, samples: int) -> float:
    """The rollout's necessary FLOPs: each prompt prefilled once (its samples share it, as a prefix cache
    does), every sample's reply tokens, and attention over each sample's context."""
    return (2.0 * shape["params"] * (prompts * prompt + samples * reply)
            + samples * attention_flops(shape, prompt, reply))


def learner_flops(shape: dict[str, int], forwarded: int, rows: list[tuple[int, int]], recompute: bool) -> float:
    """The update's FLOPs: per parameter 6 (8 with recompute) for each token the forward runs (a shared
    prompt once per group), plus forward and backward attention over each (prompt, reply) row."""
    per_param = 8.0 if recompute else 6.0
    return per_param * shape["params"] * forwarded + sum(3 * attention_flops(shape, p, r) for p, r in rows)


def gsm8k_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    from upslope.data import load_examples
    from upslope.config import DataConfig
    from upslope.data.prompts import encode_prompts

    examples = load_examples(DataConfig(task="gsm8k", split="test", limit=count), "test")
    return encode_prompts(examples, tokenizer)[0]


# ---------------------------------------------------------------- workers (fresh processes)


def worker_engine(a: argparse.Namespace) -> None:
    """One engine at one reply length: the rollout's wall time and generated tokens."""
    emit = benchlib.json_stdout()
    import torch

    from upslope.engine import SamplingParams
    from upslope.models import load_tokenizer

    torch.set_num_threads(a.threads)
    tok = load_tokenizer(a.model)
    prompts = gsm8k_prompts(tok, a.prompts)
    engine = _engine(a, tok, max(len(p) for p in prompts) + a.length)
    params = SamplingParams(n=a.n, temperature=1.0, max_new_tokens=a.length, seed=0, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=4, seed=0))  # warm-up
    t = time.perf_counter()
    groups = engine.generate(prompts, params)
    seconds = time.perf_counter() - t
    generated = sum(len(c.token_ids) for g in groups for c in g)
    emit({"event": "done", "seconds": seconds, "generated": generated, "samples": a.prompts * a.n,
          "prompt_tokens": sum(len(p) for p in prompts) * a.n})
    engine.close()


def _engine(a: argparse.Namespace, tokenizer: Any, max_len: int) -> Any:
    dtype = a.dtype
    if a.engine in ("vllm", "vllm_ngram"):
        from upslope.rollout.vllm import VLLMEngine

        kv = a.prompts * a.n * max_len * 2 * 4 * 24 * 576 / 2**30  # generous for a 135M model in fp32
        spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        return VLLMEngine(a.model, tokenizer, dtype=dtype, kv_cache_gb=min(max(kv, 0.25), 4.0),
                          max_num_seqs=a.prompts * a.n, max_model_len=max_len, threads=a.threads,
                          speculative=spec if a.engine == "vllm_ngram" else None)
    if a.engine == "hf_paged":
        from upslope.rollout.paged import PagedEngine

        return PagedEngine(a.model, tokenizer, dtype=dtype, threads=a.threads)
    from upslope.rollout.hf import HFEngine

    return HFEngine(a.model, tokenizer, dtype=dtype, batch_size=a.prompts * a.n, threads=a.threads)


def reply_lengths(a: argparse.Namespace, gen: Any) -> list[int]:
    """The reply length of each of a group's `n` samples: all `length`, or with `--mixed` one at `length`
    and the others drawn from length/16 .. length/4 (a group where one sample reasons at length)."""
    import torch

    if not getattr(a, "mixed", False):
        return [a.length] * a.n
    low, high = max(1, a.length // 16), max(2, a.length // 4)
    return [a.length] + torch.randint(low, high + 1, (a.n - 1,), generator=gen).tolist()


def worker_learner(a: argparse.Namespace) -> None:
    """One learner update on `prompts` GSM8K prompts x `n` replies of `length` tokens (random ids; with
    `--mixed` of mixed lengths, see reply_lengths)."""
    emit = benchlib.json_stdout()
    import torch

    import learner_mfu
    from upslope.batch import build_batch
    from upslope.config import load_config
    from upslope.models import load_tokenizer
    from upslope.train.learner.objectives import RLObjective
    from upslope.train.learner.updater import Updater

    torch.set_num_threads(a.threads)
    tok = load_tokenizer(a.model)
    prompts = gsm8k_prompts(tok, a.prompts)
    precision = "float32" if a.dtype == "float32" else "bfloat16"
    cfg = load_config(None, [f"model.name={a.model}", f"train.precision={precision}", f"model.dtype={a.dtype}",
                             f"rollout.max_new_tokens={a.length}", f"rollout.prompts_per_step={a.prompts}",
                             f"rollout.n={a.n}", "algo.kl_coef=0", "train.steps=3", f"train.threads={a.threads}",
                             *a.override])
    learner = Updater.from_config(cfg, a.model, device="cpu")
    objective = RLObjective.from_config(cfg)
    gen = torch.Generator().manual_seed(0)
    p_ids, c_ids, c_lps, gids = [], [], [], []
    for g, prompt in enumerate(prompts):
        for size in reply_lengths(a, gen):
            p_ids.append(prompt)
            c_ids.append(torch.randint(3, 30000, (size,), generator=gen).tolist())
            c_lps.append((-torch.rand(size, generator=gen) * 3).tolist())
            gids.append(g)
    batch = build_batch(p_ids, c_ids, c_lps, gids, [True] * len(p_ids), tok.pad_token_id)
    adv = torch.randn(len(p_ids), 1, generator=gen).expand_as(batch.loss_mask)
    batch.advantages = adv * batch.loss_mask
    first = learner.update(batch, 1, objective)  # warm-up
    t, cpu = time.perf_counter(), time.process_time()
    learner.update(batch, 2, objective)
    seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - cpu
    forwarded = learner_mfu.forwarded_tokens(batch, learner.share_prompt)
    emit({"event": "done", "seconds": seconds, "cpu_seconds": cpu_seconds, "forwarded": forwarded, "recompute": bool(cfg.train.grad_checkpointing),
          "share_prompt": bool(learner.share_prompt), "trained": int(batch.loss_mask.sum()),
          "loss": first["loss"], "padded_tokens": padded_tokens(learner, batch),
          "rows": [[int(p), int(s - p)] for p, s in zip(batch.prompt_lens, batch.seq_lens)]})


def padded_tokens(learner: Any, batch: Any) -> int:
    """Token slots the learner's micro-batches occupy, padding included (real tokens where packed)."""
    total = 0
    for idx in learner.micro_batches(batch):
        mb = batch.select(idx)
        total += learner.forwarded_tokens(mb) if learner.packs(mb) else learner.padded_slots(mb)
    return total


# ---------------------------------------------------------------- driver


def machine_bound(a: argparse.Namespace) -> tuple[Any, float, str, set[str]]:
    """Set torch's threads, measure the matmul rate at `a.dtype` (the bound's denominator) and print the CPU
    with it: the console, the rate in FLOP/s, the CPU model and its flags."""
    import torch

    from learner_mfu import matmul_peak
    from upslope.hardware import _cpuinfo

    console = benchlib.console()
    torch.set_num_threads(a.threads)
    peak = matmul_peak("cpu", "fp32" if a.dtype == "float32" else "bf16", 2048, 5)["best_flops"]
    cpu, flags = _cpuinfo()
    console.print(f"CPU {cpu} ({', '.join(f for f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16') if f in flags)}); "
                  f"{a.threads} threads; matmul {a.dtype} {peak / 1e9:.1f} GFLOP/s")
    return console, peak, cpu, flags


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--lengths", default="8,128,512", help="comma list of reply lengths")
    p.add_argument("--engines", default="vllm,hf,hf_paged", help="comma list of engines")
    p.add_argument("--prompts", type=int, default=8, help="GSM8K prompts per rollout")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="engine and learner precision")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: every core)")
    p.add_argument("--override", action="append", default=[], help="extra upslope key=value for the learner")
    p.add_argument("--out", help="results JSON (default benchmarks/results/roofline-<time>.json)")
    p.add_argument("--mixed", action="store_true", help="learner: one reply per group at the full length, the "
                                                           "others at 1/16..1/4 of it")
    p.add_argument("--worker", choices=["engine", "learner"], help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.model is None:
        from upslope.models import resolve_model

        a.model = resolve_model("smollm2-135m-instruct", announce=lambda m: print(m, file=sys.stderr))
    if a.worker == "engine":
        worker_engine(a)
        return 0
    if a.worker == "learner":
        worker_learner(a)
        return 0
    from upslope.models import load_tokenizer

    console, peak, cpu, flags = machine_bound(a)
    shape = model_shape(a.model)
    tok = load_tokenizer(a.model)
    prompt_len = sum(map(len, gsm8k_prompts(tok, a.prompts))) / a.prompts
    samples = a.prompts * a.n
    common = [sys.executable, __file__, "--model", a.model, "--prompts", str(a.prompts), "--n", str(a.n),
              "--dtype", a.dtype, "--threads", str(a.threads), *sum((["--override", o] for o in a.override), []),
              *(["--mixed"] if a.mixed else [])]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = HERE / "results" / f"roofline-{stamp}"
    rows: list[dict[str, Any]] = []
    for length in [int(x) for x in a.lengths.split(",") if x]:
        cells = [("rollout", e) for e in a.engines.split(",") if e] + [("learner", "learner")]
        for kind, name in cells:
            cmd = common + ["--worker", "engine" if kind == "rollout" else "learner", "--length", str(length)]
            cmd += ["--engine", name] if kind == "rollout" else []
            run = benchlib.run_worker(cmd, logs / f"{name}-{length}.log", timeout=3600)
            done = next((r for r in run["records"] if r.get("event") == "done"), None)
            row: dict[str, Any] = {"length": length, "kind": kind, "engine": name, "peak_rss_gib": run["peak_rss_gib"]}
            if done is None:
                row["error"] = benchlib.tail(run["log"], 5)
            elif kind == "rollout":
                flops = rollout_flops(shape, int(prompt_len), length, a.prompts, samples)
                row.update(seconds=done["seconds"], tokens_per_s=done["generated"] / done["seconds"],
                           bound_s=flops / peak, fraction=flops / peak / done["seconds"])
            else:
                flops = learner_flops(shape, done["forwarded"], done["rows"], done["recompute"])
                row.update(seconds=done["seconds"], tokens_per_s=done["forwarded"] / done["seconds"],
                           bound_s=flops / peak, fraction=flops / peak / done["seconds"], recompute=done["recompute"],
                           loss=done["loss"], padded_tokens=done["padded_tokens"], forwarded=done["forwarded"])
            rows.append(row)
            console.print(f"  {length:4d} tokens {kind:8s} {name:9s}: " + (
                f"{row['tokens_per_s']:8.1f} tokens/s, {row['seconds']:.2f} s vs bound {row['bound_s']:.2f} s = "
                f"{row['fraction']:.0%}" if "fraction" in row else f"failed: {row['error'][-200:]}"))
    out = Path(a.out) if a.out else HERE / "results" / f"roofline-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "roofline", "cpu": cpu, "flags": sorted(flags), "threads": a.threads,
                               "dtype": a.dtype, "matmul_flops": peak, "shape": shape, "prompt_tokens": prompt_len,
                               "samples": samples, "machine": benchlib.machine_info(), "rows": rows}, indent=1))
    console.print(f"[dim]wrote {out}[/dim]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
