"""The GPU check's driver (run by benchmarks/gpu_check.sh on a lent GPU machine, or here with
--cpu-dry-run and tiny shapes to prove the script end to end): random-init models of real
shapes (no hub), the learner MFU table, HF engine tokens/s, a few loop steps with the step-time
split, and a 2-rank DDP check when there are 2+ GPUs. Writes one JSON results file."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# (hidden, layers, heads, kv heads, MLP); the vocabulary is the skeleton tokenizer's (SmolLM2: 49152)
SHAPES = {"0.5b": (896, 24, 14, 2, 4864),  # Qwen2.5-0.5B's body
          "1.7b": (2048, 24, 32, 32, 8192),  # SmolLM2-1.7B
          "dry": (128, 2, 2, 1, 256)}  # --cpu-dry-run


def build_model(shape: str, skeleton: str, root: Path) -> str:
    """A random-init Llama of `shape` with the skeleton's tokenizer, saved once under `root`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = root / f"random-{shape}"
    if (path / "config.json").exists():
        return str(path)
    hidden, layers, heads, kv, inter = SHAPES[shape]
    tok = AutoTokenizer.from_pretrained(skeleton)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=hidden // heads, vocab_size=len(tok),
                      max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return str(path)


def learner_table(model: str, device: str, out: Path, dry: bool) -> dict[str, Any]:
    """benchmarks/learner_mfu.py cells: fp32-master (bf16-mixed) and pure bf16, with and without shared prompts."""
    size = ["--long-prompts", "2", "--long-n", "2", "--long-new-tokens", "16", "--steps", "1", "--mm-size", "256",
            "--mm-repeats", "2"] if dry else ["--long-prompts", "16", "--long-n", "8", "--long-new-tokens", "512"]
    cmd = [sys.executable, str(HERE / "learner_mfu.py"), "--device", device, "--model", model, "--shapes", "long",
           "--precisions", "bf16-mixed,bf16", "--share-prompt", "true,false", "--out", str(out), *size,
           "--override", "train.grad_checkpointing=false"]
    return _run(cmd, out)


def engine_tokens_per_s(model: str, device: str, dry: bool) -> dict[str, Any]:
    """HF engine generation rate (bf16 on a GPU) at a few batch sizes."""
    import torch

    from upslope.models import load_tokenizer
    from upslope.rollout.base import SamplingParams
    from upslope.rollout.hf import HFEngine

    tok = load_tokenizer(model)
    dtype = "float32" if device == "cpu" else "bfloat16"
    new = 8 if dry else 256
    out = {}
    for batch in ([2] if dry else [64, 256]):
        engine = HFEngine(model, tok, dtype=dtype, batch_size=batch, device=device)
        prompts = [tok.encode(f"What is {i} * 7?") for i in range(batch)]
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new, seed=0)  # (a random model rarely stops)
        engine.generate(prompts[:2], params)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        got = engine.generate(prompts, params)
        seconds = time.perf_counter() - t
        tokens = sum(len(c.token_ids) for cs in got for c in cs)
        out[f"batch_{batch}"] = {"tokens": tokens, "seconds": round(seconds, 3),
                                 "tokens_per_s": round(tokens / seconds, 1), "device": engine.device}
        engine.close()
        del engine
    return out


def loop_steps(model: str, run_dir: Path, dry: bool) -> dict[str, Any]:
    """A few `upslope train` steps (HF engine) and each step's time split."""
    steps = 2 if dry else 3
    args = [sys.executable, "-m", "upslope.cli", "train", f"model.name={model}", "engine.name=hf", f"run_dir={run_dir}",
            f"train.steps={steps}", "train.eval_before=false", "train.eval_after=false", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=" + ("2" if dry else "16"),
            "rollout.n=" + ("2" if dry else "8"), "rollout.max_new_tokens=" + ("8" if dry else "256")]
    result = _run(args, None)
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    keep = ("time/", "rollout/tokens_per_s", "learner/tokens_per_s", "rollout/engine_on_gpu")
    result["steps"] = [{k: v for k, v in r.items() if k == "step" or k.startswith(keep)} for r in rows]
    return result


def ddp_check(dry: bool) -> dict[str, Any]:
    """2-rank NCCL all-reduce through torchrun when there are 2+ GPUs; else skipped (said so)."""
    import torch

    if dry or torch.cuda.device_count() < 2:
        return {"status": f"skipped: {torch.cuda.device_count()} GPU(s)"}
    script = ("import os, torch, torch.distributed as d; d.init_process_group('nccl'); r=d.get_rank(); "
              "torch.cuda.set_device(r); x=torch.ones(1, device='cuda')*(r+1); d.all_reduce(x); "
              "assert x.item()==3; d.destroy_process_group()")
    return _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-c", script], None)


def _run(cmd: list[str], out: Path | None) -> dict[str, Any]:
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    result: dict[str, Any] = {"rc": proc.returncode, "seconds": round(time.perf_counter() - t, 1)}
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-3000:]
    if out is not None and out.is_file():
        result["result"] = json.loads(out.read_text())
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="results JSON path")
    p.add_argument("--skeleton", required=True, help="model directory whose tokenizer the random models use")
    p.add_argument("--work", default="/tmp/upslope-gpu-check", help="scratch directory for models and runs")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU: proves the script, no numbers")
    p.add_argument("--only", default="learner,engine,loop,ddp", help="comma list of the parts to run")
    a = p.parse_args()
    import torch

    dry = a.cpu_dry_run
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (use --cpu-dry-run to test the script)", file=sys.stderr)
        return 2
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    parts = set(a.only.split(","))
    report: dict[str, Any] = {"dry_run": dry, "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    shapes = ["dry"] if dry else ["0.5b", "1.7b"]
    for shape in shapes:
        t = time.perf_counter()
        model = build_model(shape, a.skeleton, work)
        cell: dict[str, Any] = {"model": model, "build_s": round(time.perf_counter() - t, 1)}
        if "learner" in parts:
            cell["learner"] = learner_table(model, device, work / f"learner-{shape}.json", dry)
        if "engine" in parts:
            cell["engine"] = engine_tokens_per_s(model, device, dry)
        if "loop" in parts and shape in ("dry", "0.5b"):
            cell["loop"] = loop_steps(model, work / f"loop-{shape}", dry)
        report[shape] = cell
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")  # partial results survive a timeout
    if "ddp" in parts:
        report["ddp"] = ddp_check(dry)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
