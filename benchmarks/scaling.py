"""How upslope's step cost and peak memory scale with completions per step and max new
tokens (upslope only). Every cell is a fresh subprocess (the upslope worker of
grpo_vs_trl.py, at upslope's defaults) whose whole process tree's RSS is sampled.

By default two one-dimensional sweeps through the base point (32 completions, 32 new
tokens): completions per step 16, 32, 64, 128 at 32 new tokens, then max new tokens 32,
128, 512 at 32 completions; `--grid` runs every combination instead. Completions per step
= prompts per step x n (n = 4 by default).

What to look for: seconds per step about proportional to the tokens generated and trained;
peak RSS roughly flat, far below the [samples x sequence x vocab] fp32 logits tensor a
naive log-prob computation would hold (the "naive logits" column), since upslope runs the
LM head in chunks and the learner in token-budgeted micro-batches.

Note: max new tokens is a cap; completions that end (eos) earlier generate fewer tokens.
The table reports the tokens actually generated, and the costs per token.

Usage:
  nice -n 19 python benchmarks/scaling.py --steps 3
  nice -n 19 python benchmarks/scaling.py --grid --steps 3
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "grpo_vs_trl.py"


def cells(a: argparse.Namespace) -> list[tuple[int, int]]:
    comps = [int(x) for x in a.completions.split(",") if x]
    toks = [int(x) for x in a.new_tokens.split(",") if x]
    if a.grid:
        return list(itertools.product(comps, toks))
    base_c = a.base_completions if a.base_completions in comps else comps[0]
    base_t = a.base_new_tokens if a.base_new_tokens in toks else toks[0]
    out = [(c, base_t) for c in comps] + [(base_c, t) for t in toks if t != base_t]
    return out


def run_cell(a: argparse.Namespace, completions: int, new_tokens: int, work: Path, logs: Path,
             rep: int) -> dict[str, Any]:
    if completions % a.n:
        raise SystemExit(f"completions per step {completions} is not a multiple of --n {a.n}")
    prompts = completions // a.n
    tag = f"c{completions}-t{new_tokens}-r{rep}"
    cmd = [sys.executable, str(WORKER), "--worker", "upslope", "--steps", str(a.steps),
           "--prompts-per-step", str(prompts), "--n", str(a.n), "--max-new-tokens", str(new_tokens),
           "--temperature", str(a.temperature), "--lr", str(a.lr), "--seed", str(a.seed), "--run-dir", str(work / tag)]
    if a.precision == "fp32":
        cmd += ["--precision", "fp32"]
    for o in a.override or []:
        cmd += ["--override", o]

    def on_record(rec: dict[str, Any], sampler: benchlib.TreeRSS) -> None:
        if rec.get("event") == "step" and rec["step"] == a.warmup:
            sampler.mark()

    run = benchlib.run_worker(cmd, logs / f"{tag}.log", timeout=a.timeout, interval=a.sample_interval,
                              on_record=on_record)
    steps = [r for r in run["records"] if r.get("event") == "step"]
    timed = [r for r in steps if r["step"] > a.warmup] or steps
    meta = next((r for r in run["records"] if r.get("event") == "meta"), {})
    err = next((r.get("error") for r in run["records"] if r.get("event") == "error"), None)

    def med(key: str) -> float | None:
        return benchlib.summary([r.get(key) for r in timed])["median"]

    gen = med("generated_tokens")
    learner_tokens = benchlib.summary([(r.get("learner_tokens_per_s") or 0) * (r.get("learner_s") or 0)
                                       for r in timed])["median"]
    step_s = med("wall_s")
    seq = meta.get("mean_prompt_tokens", 45) + new_tokens
    return {
        "completions": completions, "new_tokens": new_tokens, "prompts": prompts, "n": a.n, "repeat": rep,
        "steps_done": len(steps), "returncode": run["returncode"], "error": err, "log": run["log"],
        "s_per_step": benchlib.summary([r["wall_s"] for r in timed]), "rollout_s": med("rollout_s"),
        "learner_s": med("learner_s"), "sync_s": med("sync_s"), "generated_tokens": gen,
        "mean_length": med("mean_length"), "truncated_frac": med("truncated_frac"),
        "learner_row_tokens": learner_tokens,
        "ms_per_generated_token": 1e3 * step_s / gen if step_s and gen else None,
        "peak_rss_gib": run["peak_rss_gib"], "peak_rss_after_warmup_gib": run["peak_rss_after_warmup_gib"],
        "naive_logits_gib": completions * seq * a.vocab * 4 / benchlib.GIB,
        "engine": meta.get("engine"), "learner_precision": meta.get("learner_precision"), "wall_s": run["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--completions", default="16,32,64,128", help="completions per step to sweep")
    p.add_argument("--new-tokens", default="32,128,512", help="max new tokens to sweep")
    p.add_argument("--base-completions", type=int, default=32)
    p.add_argument("--base-new-tokens", type=int, default=32)
    p.add_argument("--grid", action="store_true", help="every combination instead of two sweeps through the base")
    p.add_argument("--n", type=int, default=4, help="completions per prompt")
    p.add_argument("--steps", type=int, default=3, help="steps per cell (first --warmup excluded)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--precision", choices=["default", "fp32"], default="default", help="learner precision")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=49152, help="vocabulary size for the naive-logits column")
    p.add_argument("--override", action="append", help="extra upslope key=value override (repeatable)")
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--sample-interval", type=float, default=0.2)
    p.add_argument("--out", help="result JSON path (default benchmarks/results/scaling-<time>.json)")
    a = p.parse_args(argv)
    if a.steps <= a.warmup:
        p.error("--steps must exceed --warmup")

    from rich.table import Table

    console = benchlib.console()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(a.out) if a.out else HERE / "results" / f"scaling-{stamp}.json"
    logs = out.with_suffix("")
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    result: dict[str, Any] = {"benchmark": "scaling", "started": stamp, "machine": benchlib.machine_info(),
                              "config": vars(a), "cells": []}
    console.print(f"[dim]results -> {out}; worker logs -> {logs}/[/dim]")
    for rep in range(1, a.repeats + 1):
        for c, t in cells(a):
            console.print(f"[bold]{c} completions x {t} new tokens[/bold] (repeat {rep}) ...", end=" ")
            cell = run_cell(a, c, t, work, logs, rep)
            result["cells"].append(cell)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1, default=str))
            bad = cell["returncode"] != 0 or cell["error"]
            console.print(f"{benchlib.fmt(cell['s_per_step']['median'])} s/step, peak RSS "
                          f"{cell['peak_rss_gib']:.2f} GiB" + (f" [red]FAILED: {cell['error'] or cell['returncode']}"
                                                              f"[/red]\n{benchlib.tail(cell['log'])}" if bad else ""))
    base = next((x for x in result["cells"] if x["completions"] == a.base_completions
                 and x["new_tokens"] == a.base_new_tokens and x["s_per_step"]["median"]), None)
    tab = Table(title=f"upslope scaling ({a.precision} learner precision; {a.steps} steps/cell, first {a.warmup} "
                      f"excluded; medians)")
    for col in ("completions", "max new", "s/step", "x base", "rollout s", "learner s", "gen tokens",
                "x base ", "ms/gen token", "peak RSS GiB", "naive logits GiB"):
        tab.add_column(col, justify="right")
    for x in result["cells"]:
        s = x["s_per_step"]["median"]
        tab.add_row(str(x["completions"]), str(x["new_tokens"]), benchlib.fmt(s),
                    benchlib.fmt(benchlib.ratio(s, base["s_per_step"]["median"]) if base else None, ".2f", "x"),
                    benchlib.fmt(x["rollout_s"]), benchlib.fmt(x["learner_s"]), benchlib.fmt(x["generated_tokens"], ".0f"),
                    benchlib.fmt(benchlib.ratio(x["generated_tokens"], base["generated_tokens"]) if base else None,
                                 ".2f", "x"),
                    benchlib.fmt(x["ms_per_generated_token"], ".1f"), benchlib.fmt(x["peak_rss_gib"]),
                    benchlib.fmt(x["naive_logits_gib"], ".1f"))
    console.print(tab)
    result["finished"] = time.strftime("%Y%m%d-%H%M%S")
    out.write_text(json.dumps(result, indent=1, default=str))
    console.print(f"[dim]wrote {out}[/dim]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
