"""The GPU check's driver: run by benchmarks/gpu_check.sh on a lent GPU machine, or here with
--cpu-dry-run and tiny shapes to prove the script end to end (no numbers).

Each part runs in its own subprocess under its own time limit (the smaller of the part's limit and
what is left of the whole check's budget) and writes its results to a JSON file as it goes, so a
part that fails, hangs or runs out of time keeps what it measured and the next part still runs.
After every part the driver merges everything into one results file (`--out`) and a readable
summary beside it (`.md`).

Parts, in order: env (versions, GPU, bf16/fp32 matmul peak), fsdp (FSDP2 at world size 1 against
the unsharded model: same log-probs, gradients and update), pytest (the gpu-marked tests),
models (random-init models of real shapes, no hub), engine (tokens/s of the hf and hf_paged
engines at batch 64 and 256, 256-token replies), learner (tokens/s and MFU against the measured
bf16 peak, shared prompts on and off, and a kernel profile of one update), loop (a few
`upslope train` steps: time split and peak GPU memory)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# (hidden, layers, heads, kv heads, MLP); the vocabulary is the skeleton tokenizer's (SmolLM2: 49152)
SHAPES = {"0.5b": (896, 24, 14, 2, 4864),  # Qwen2.5-0.5B's body
          "1.7b": (2048, 24, 32, 32, 8192),  # SmolLM2-1.7B
          "dry": (128, 2, 2, 1, 256)}  # --cpu-dry-run
# part -> its own time limit in seconds on the GPU (the dry run has no limits but the whole)
LIMITS = {"env": 45, "fsdp": 60, "pytest": 150, "models": 75, "engine": 120, "learner": 150, "loop": 100}
ORDER = list(LIMITS)


class Part:
    """What a part's subprocess is given and how it records: `record(key, value)` rewrites its JSON."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dry: bool = args.cpu_dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.work = Path(args.work)
        self.results: dict[str, Any] = {}
        self.path = self.work / f"part-{args.part}.json"
        self.deadline: float = args.deadline or float("inf")  # wall-clock time the driver stops this part at

    def left(self, margin: float = 5.0) -> float | None:
        """Seconds this part may still give a subprocess of its own (None: no limit)."""
        return None if self.deadline == float("inf") else max(self.deadline - time.time() - margin, 1.0)

    def record(self, key: str, value: Any) -> None:
        self.results[key] = value
        self.path.write_text(json.dumps(self.results, indent=1, default=str) + "\n")

    def shapes(self) -> list[str]:
        return ["dry"] if self.dry else ["0.5b", "1.7b"]

    def model(self, shape: str) -> str:
        return str(self.work / f"random-{shape}")

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


# ---------------------------------------------------------------- parts (each in its own process)


def part_env(p: Part) -> None:
    import torch
    import transformers

    from learner_mfu import matmul_peak

    p.record("versions", {"python": sys.version.split()[0], "torch": torch.__version__,
                          "transformers": transformers.__version__,
                          "vllm": "importable" if importlib.util.find_spec("vllm") else "absent"})
    if p.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        p.record("gpu", {"name": props.name, "count": torch.cuda.device_count(),
                         "memory_gib": round(props.total_memory / 2**30, 1), "capability": f"{props.major}.{props.minor}"})
        torch.backends.cuda.matmul.allow_tf32 = False
    size, repeats = (256, 2) if p.dry else (8192, 10)
    p.record("matmul_peak_tflops", {k: round(matmul_peak(p.device, k, size, repeats)["best_flops"] / 1e12, 3)
                                    for k in ("bf16", "fp32")})


def part_pytest(p: Part) -> None:
    out = Path(p.args.out).parent / "pytest_gpu.txt"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider", "-rfE"]
    if not p.dry and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "4"]  # the tests are small: four at a time on one GPU
    t = time.perf_counter()
    with out.open("w") as log:
        try:
            rc: int | str = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=_env(),
                                           timeout=p.left()).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    lines = out.read_text().splitlines()
    p.record("pytest", {"rc": rc, "seconds": round(time.perf_counter() - t, 1), "summary": lines[-1] if lines else "",
                        "failed": [x for x in lines if x.startswith(("FAILED", "ERROR"))][:20]})


def part_models(p: Part) -> None:
    """Random-init Llama models of each shape with the skeleton's tokenizer, built on the GPU and saved in bf16."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(p.args.skeleton)
    for shape in p.shapes():
        path = Path(p.model(shape))
        if (path / "config.json").exists():
            continue
        t = time.perf_counter()
        hidden, layers, heads, kv, inter = SHAPES[shape]
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads,
                          vocab_size=len(tok), max_position_embeddings=4096, tie_word_embeddings=True,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        with torch.device(p.device):
            model = LlamaForCausalLM(cfg)
        model.to(torch.float32 if p.dry else torch.bfloat16).save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
        params = sum(x.numel() for x in model.parameters())
        del model
        p.record(shape, {"params": params, "build_s": round(time.perf_counter() - t, 1)})


def part_engine(p: Part) -> None:
    """Generation tokens/s of each engine at each batch size (one prompt per sequence, n=1, a random
    model rarely stops so nearly every reply is full length), after one warm-up call."""
    import torch

    from upslope.engine import SamplingParams
    from upslope.models import load_tokenizer
    from upslope.rollout.hf import HFEngine
    from upslope.rollout.paged import PagedEngine

    shape = p.shapes()[-1]
    model = p.model(shape)
    tok = load_tokenizer(model)
    dtype = "float32" if p.dry else "bfloat16"
    new, batches = (8, [2, 4]) if p.dry else (256, [64, 256])
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new, seed=0)
    builders: dict[str, Callable[[], Any]] = {
        "hf_paged+graphs": lambda: PagedEngine(model, tok, dtype=dtype, device=p.device, cuda_graphs=True),
        "hf": lambda: HFEngine(model, tok, dtype=dtype, batch_size=max(batches), device=p.device),
        "hf_paged": lambda: PagedEngine(model, tok, dtype=dtype, device=p.device, cuda_graphs=False)}
    wanted = os.environ.get("UPSLOPE_GPU_ENGINES", ",".join(builders)).split(",")
    out: dict[str, Any] = {"shape": shape, "new_tokens": new}
    for name in [n for n in builders if n in wanted]:
        try:
            engine = builders[name]()
            for batch in batches:
                prompts = [tok.encode(f"Question {i}: what is {i} * 7?") for i in range(batch)]
                t = time.perf_counter()
                engine.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=4, seed=0))  # warm-up
                p.sync()
                warm = time.perf_counter() - t
                t = time.perf_counter()
                got = engine.generate(prompts, params)
                p.sync()
                seconds = time.perf_counter() - t
                tokens = sum(len(c.token_ids) for cs in got for c in cs)
                out[f"{name}/batch_{batch}"] = {"tokens": tokens, "seconds": round(seconds, 3),
                                                "warmup_s": round(warm, 2), "tokens_per_s": round(tokens / seconds, 1),
                                                "device": engine.device}
                p.record("engine", out)
            engine.close()
            del engine
        except Exception as exc:  # one engine failing must not lose the others
            out[f"{name}/error"] = repr(exc)[:400]
        if p.device == "cuda":
            torch.cuda.empty_cache()
        p.record("engine", out)
    for batch in batches:
        for name in ("hf_paged", "hf_paged+graphs"):
            hf, paged = out.get(f"hf/batch_{batch}"), out.get(f"{name}/batch_{batch}")
            if hf and paged:
                out[f"{name}_over_hf/batch_{batch}"] = round(paged["tokens_per_s"] / hf["tokens_per_s"], 2)
    p.record("engine", out)


def part_learner(p: Part) -> None:
    """learner_mfu cells (long shape: 16 prompts x 8 x (38 + 512) tokens on a GPU), each against the bf16
    matmul peak measured here, then a kernel profile of one bf16-mixed update on the largest shape."""
    import learner_mfu

    size = ["--long-prompts", "2", "--long-n", "2", "--long-new-tokens", "16", "--steps", "1"] if p.dry else \
        ["--long-prompts", "16", "--long-n", "8", "--long-new-tokens", "512", "--steps", "2"]
    overrides = ["--override", "train.grad_checkpointing=false"]
    peak = learner_mfu.matmul_peak(p.device, "bf16", 256 if p.dry else 8192, 2 if p.dry else 10)["best_flops"]
    p.record("bf16_peak_tflops", round(peak / 1e12, 1))
    # (shape, precision, shared prompts): the largest shape's cells first, the goal is measured there
    cells = [("dry", "bf16-mixed", True), ("dry", "bf16", False)] if p.dry else \
        [("1.7b", "bf16-mixed", True), ("1.7b", "bf16-mixed", False), ("1.7b", "bf16", True), ("0.5b", "bf16-mixed", True)]
    rows = []
    for shape, precision, share in cells:
        a = learner_mfu.parse_args(["--device", p.device, "--model", p.model(shape), *size, *overrides])
        t = time.perf_counter()
        try:
            cell = learner_mfu.run_cell(a, p.model(shape), "long", precision, share)
        except Exception as exc:  # one failing cell must not lose the others
            rows.append({"shape": shape, "precision": precision, "share_prompt": share, "error": repr(exc)[:400]})
            p.record("cells", rows)
            continue
        rows.append({"shape": shape, "precision": precision, "share_prompt": share,
                     "tokens_per_s": round(cell["tokens_per_s"]), "mfu": round(cell["flops_per_s"] / peak, 3),
                     "s_per_update": cell["s_per_update"]["median"], "forwarded_tokens": cell["forwarded_tokens"],
                     "micro_batch_tokens": cell["micro_batch_tokens"], "params": cell["params"],
                     "cuda_peak_gib": round(cell.get("cuda_peak_gib", 0.0), 1), "cell_s": round(time.perf_counter() - t)})
        p.record("cells", rows)
    p.record("profile", profile_update(p, p.shapes()[-1], size, overrides))


def profile_update(p: Part, shape: str, size: list[str], overrides: list[str]) -> list[dict[str, Any]]:
    """The 15 kernels (or CPU ops) that took the most time in one bf16-mixed update, shared prompts on."""
    from torch.profiler import ProfilerActivity, profile

    import learner_mfu
    from upslope.config import load_config
    from upslope.train.learner.objectives import RLObjective
    from upslope.train.learner.updater import Updater

    a = learner_mfu.parse_args(["--device", p.device, "--model", p.model(shape), *size, *overrides])
    cfg = load_config(None, [f"model.name={p.model(shape)}", *learner_mfu.PRECISIONS["bf16-mixed"][0],
                             f"rollout.max_new_tokens={a.long_new_tokens}", f"rollout.prompts_per_step={a.long_prompts}",
                             f"rollout.n={a.long_n}", "algo.kl_coef=0", "train.steps=3", *a.override])
    learner = Updater.from_config(cfg, p.model(shape), device=p.device)
    objective = RLObjective.from_config(cfg)
    batch = learner_mfu.synthetic_batch(a.long_prompts, a.long_n, a.long_prompt_tokens, a.long_new_tokens,
                                        learner.model.config.vocab_size, pad_id=2, seed=0)
    learner.update(batch, 1, objective)  # warm-up
    p.sync()
    cuda = p.device == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        learner.update(batch, 2, objective)
        p.sync()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:15]
    total = sum(getattr(e, key, 0) for e in prof.key_averages()) or 1
    return [{"name": e.key[:90], "ms": round(getattr(e, key, 0) / 1e3, 1), "share": round(getattr(e, key, 0) / total, 3),
             "calls": e.count} for e in events]


def part_loop(p: Part) -> None:
    """A few `upslope train` steps with the hf_paged engine on the 0.5B shape: each step's time split and
    peak GPU memory; the steps that finished are kept when the part runs out of time."""
    shape = p.shapes()[0]
    run = p.work / f"loop-{shape}"
    size = ["rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8", "train.steps=2"] if p.dry else \
        ["rollout.prompts_per_step=8", "rollout.n=8", "rollout.max_new_tokens=256", "train.steps=3"]
    args = [sys.executable, "-m", "upslope.cli", "train", f"model.name={p.model(shape)}", "engine.name=hf_paged",
            f"run_dir={run}", "train.eval_before=false", "train.eval_after=false", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "data.task=gsm8k", *size]
    t = time.perf_counter()
    log = p.work / "loop.log"
    with log.open("w") as f:
        try:
            rc: int | str = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=_env(),
                                           timeout=p.left()).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    result: dict[str, Any] = {"rc": rc, "seconds": round(time.perf_counter() - t, 1), "args": args[3:]}
    if rc != 0:
        result["log_tail"] = log.read_text(errors="replace")[-2500:]
    metrics = run / "metrics.jsonl"
    keep = ("time/", "rollout/tokens_per_s", "learner/tokens_per_s", "rollout/engine_on_gpu", "memory/", "mismatch",
            "length/mean")
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    result["steps"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                        if k == "step" or k.startswith(keep)} for r in rows]
    p.record("loop", result)


def part_fsdp(p: Part) -> None:
    """FSDP2 at world size 1 (NCCL on a GPU, gloo on the CPU) against the same model unsharded: the
    log-probs, the gradients and one AdamW update agree."""
    import torch
    import torch.distributed as dist

    from upslope.config import load_config
    from upslope.distributed import shard
    from upslope.models import load_model, make_tiny_model
    from upslope.train.learner.logprobs import token_scores

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(29500 + os.getpid() % 1000))
    device = torch.device(p.device)
    dist.init_process_group("nccl" if p.device == "cuda" else "gloo")
    try:
        path = make_tiny_model(p.args.skeleton, p.work / "fsdp-tiny", layers=2, hidden=128)
        cfg = load_config(None, [f"model.name={path}", "dist.strategy=fsdp", "train.precision=float32"])
        plain = load_model(path, "float32").to(device)
        sharded = shard.shard_model(load_model(path, "float32").to(device), cfg.dist, cfg.train, device)
        shard.register_entry(sharded, token_scores)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 1000, (4, 24), generator=gen).to(device)
        mask = torch.ones_like(ids)
        target = mask.clone()
        target[:, :8] = 0
        report: dict[str, Any] = {"sharded": shard.is_sharded(sharded)}
        outs = []
        for model in (plain, sharded):
            out = shard.entry(model, token_scores)(ids, mask, target)
            (-out.logprobs.sum()).backward()
            outs.append(out.logprobs.detach())
        report["max_logprob_diff"] = float((outs[0] - outs[1]).abs().max())
        grads = [(n, q.grad.full_tensor() if hasattr(q.grad, "full_tensor") else q.grad)
                 for n, q in sharded.named_parameters()]
        plain_grads = dict(plain.named_parameters())
        report["max_grad_diff"] = max(float((g - plain_grads[n].grad).abs().max()) for n, g in grads)
        for model in (plain, sharded):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            opt.step()
        after = dict(plain.named_parameters())
        report["max_param_diff_after_step"] = max(
            float(((q.full_tensor() if hasattr(q, "full_tensor") else q) - after[n]).abs().max())
            for n, q in sharded.named_parameters())
        report["ok"] = max(report["max_logprob_diff"], report["max_grad_diff"], report["max_param_diff_after_step"]) < 1e-4
        p.record("fsdp", report)
    finally:
        dist.destroy_process_group()


PARTS: dict[str, Callable[[Part], None]] = {"env": part_env, "pytest": part_pytest, "models": part_models,
                                            "engine": part_engine, "learner": part_learner, "loop": part_loop,
                                            "fsdp": part_fsdp}


# ---------------------------------------------------------------- the driver


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{REPO}:{path}" if path else str(REPO), "PYTHONUNBUFFERED": "1"}


def run_part(name: str, a: argparse.Namespace, limit: float) -> dict[str, Any]:
    """Run one part in a subprocess for at most `limit` seconds; what it recorded, its exit and its time."""
    work = Path(a.work)
    (work / f"part-{name}.json").unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--part", name, "--out", a.out, "--skeleton", a.skeleton, "--work", a.work]
    cmd += ["--cpu-dry-run"] if a.cpu_dry_run else []
    cmd += ["--deadline", str(time.time() + limit)]
    t = time.perf_counter()
    log = work / f"part-{name}.log"
    with log.open("w") as f:
        try:
            rc: int | str = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=_env(),
                                           timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {limit:.0f} s"
    recorded = work / f"part-{name}.json"
    result: dict[str, Any] = json.loads(recorded.read_text()) if recorded.is_file() else {}
    result["_run"] = {"rc": rc, "seconds": round(time.perf_counter() - t, 1)}
    if rc != 0:
        result["_run"]["log_tail"] = log.read_text(errors="replace")[-2500:]
    return result


def summary(report: dict[str, Any]) -> str:
    """The results as a short Markdown page (what a reader looks at first)."""
    lines = [f"# GPU check ({'CPU dry run' if report['dry_run'] else 'GPU'}), {report['started']}", ""]
    for name, part in report["parts"].items():
        run = part.get("_run", {})
        lines.append(f"- **{name}**: rc {run.get('rc')}, {run.get('seconds')} s")
    env = report["parts"].get("env", {})
    lines += ["", f"versions: {env.get('versions')}; gpu: {env.get('gpu')}; matmul peak TFLOP/s: "
                  f"{env.get('matmul_peak_tflops')}", ""]
    tests = report["parts"].get("pytest", {}).get("pytest")
    if tests:
        lines += [f"pytest -m gpu: {tests['summary']}", *[f"  - {x}" for x in tests["failed"]], ""]
    engine = report["parts"].get("engine", {}).get("engine", {})
    if engine:
        lines += ["| engine | batch | tokens/s | seconds |", "|---|---|---|---|"]
        lines += [f"| {k.split('/')[0]} | {k.split('_')[-1]} | {v['tokens_per_s']} | {v['seconds']} |"
                  for k, v in engine.items() if isinstance(v, dict)]
        lines += [f"{k}: {v}" for k, v in engine.items() if "_over_hf" in k or k.endswith("/error")] + [""]
    cells = report["parts"].get("learner", {}).get("cells", [])
    if cells:
        lines += ["| shape | precision | shared prompts | tokens/s | MFU (bf16 peak) | s/update | peak GiB |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {c['shape']} | {c['precision']} | {c['share_prompt']} | {c.get('tokens_per_s', '-')} | "
                  f"{c.get('mfu', c.get('error', '-'))} | {c.get('s_per_update', '-')} | {c.get('cuda_peak_gib', '-')} |"
                  for c in cells] + [""]
    loop = report["parts"].get("loop", {}).get("loop", {})
    if loop.get("steps"):
        lines += ["| step | step s | rollout s | learner s | sync s | rollout tok/s | GPU peak GiB |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {s['step']} | {s.get('time/step', 0):.2f} | {s.get('time/rollout', 0):.2f} | "
                  f"{s.get('time/learner', 0):.2f} | {s.get('time/sync', 0):.2f} | {s.get('rollout/tokens_per_s', 0):.0f} "
                  f"| {s.get('memory/gpu_peak_gib', '-')} |" for s in loop["steps"]] + [""]
    fsdp = report["parts"].get("fsdp", {}).get("fsdp")
    if fsdp:
        lines += [f"fsdp (world size 1): {fsdp}", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="results JSON path (a .md summary is written beside it)")
    p.add_argument("--skeleton", required=True, help="model directory whose tokenizer the random models use")
    p.add_argument("--work", default="/tmp/upslope-gpu-check", help="scratch directory for models and runs")
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU: proves the script, no numbers")
    p.add_argument("--only", default=",".join(ORDER), help="comma list of the parts to run, in this order")
    p.add_argument("--budget", type=float, default=420, help="seconds for the whole check (GPU): a part gets at "
                                                             "most what is left")
    p.add_argument("--limits", default=os.environ.get("UPSLOPE_GPU_LIMITS", ""),
                   help="per-part limits in seconds replacing the defaults, e.g. engine=200,loop=120")
    p.add_argument("--part", help=argparse.SUPPRESS)  # internal: run this one part here
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)  # internal: when the part is stopped
    a = p.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    if a.part:
        PARTS[a.part](Part(a))
        return 0
    if not a.cpu_dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA GPU here (use --cpu-dry-run to test the script)", file=sys.stderr)
            return 2
    limits = {k: float(v) for k, v in (x.split("=") for x in a.limits.split(",") if x)}
    start = time.perf_counter()
    report: dict[str, Any] = {"dry_run": a.cpu_dry_run, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                              "commit": _commit(), "parts": {}}
    for name in [x for x in a.only.split(",") if x]:
        left = a.budget - (time.perf_counter() - start)
        if left < 10:
            report["parts"][name] = {"_run": {"rc": "skipped: the check's budget is spent", "seconds": 0}}
            continue
        limit = left if a.cpu_dry_run else min(limits.get(name, LIMITS[name]), left)
        print(f"gpu_check: {name} (at most {limit:.0f} s) ...", flush=True)
        report["parts"][name] = run_part(name, a, limit)
        print(f"gpu_check: {name}: rc {report['parts'][name]['_run']['rc']}, "
              f"{report['parts'][name]['_run']['seconds']} s", flush=True)
        report["seconds"] = round(time.perf_counter() - start, 1)
        Path(a.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
        Path(a.out).with_suffix(".md").write_text(summary(report))
    print(summary(report))
    return 0 if all(part["_run"]["rc"] == 0 for part in report["parts"].values()) else 1


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
