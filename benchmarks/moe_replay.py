"""Routing replay (R3) on a MoE that reads and answers: the embedded SmolLM2-135M upcycled into a Mixtral
MoE (`upslope.upcycle`: every MLP copied into --experts experts with --noise x RMS noise, a fresh
router, top --top-k), trained on the default task (`upslope train`: one-digit products) with the hf
engine, with algo.routing_replay off and on, over --seeds. Per run: the train/inference mismatch
(mean |learner - sampler| log-prob per token) and KL(sampler || learner) per token, both averaged over
the steps, the mean training reward of the last 10 steps, held-out accuracy after the last step, seconds
per step and the run's CPU seconds. Writes OUT/results.json and OUT/results.md (a markdown table of the
means over seeds).

    PYTHONPATH=$PWD python benchmarks/moe_replay.py --steps 20 --out /tmp/moe-replay      # docs/models.md: 3 seeds
    PYTHONPATH=$PWD python benchmarks/moe_replay.py --steps 2 --seeds 1 --out /tmp/smoke   # smoke
    PYTHONPATH=$PWD python benchmarks/moe_replay.py --merge OUT1 OUT2 ... --out OUT         # one table of runs made apart
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from upslope.models import resolve_model
from upslope.upcycle import upcycle_directory


def one_run(model: str, out: Path, replay: bool, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One `upslope train` run of the arm (a subprocess, so that its CPU time is its own); its summary row."""
    run_dir = out / f"replay-{'on' if replay else 'off'}-seed{seed}"
    argv = [sys.executable, "-m", "upslope.cli", "train", f"model.name={model}", "engine.name=hf",
            f"run_dir={run_dir}", f"train.steps={args.steps}", f"train.seed={seed}", f"engine.seed={seed}",
            f"algo.routing_replay={str(replay).lower()}", "train.eval_before=false", f"eval.limit={args.eval_limit}",
            "log.progress=false", "log.tensorboard=false", *args.set]
    if run_dir.exists():  # a run cut short: start it again
        shutil.rmtree(run_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    mean = lambda key, rs=steps: statistics.fmean(r[key] for r in rs if key in r)  # noqa: E731
    return {"replay": replay, "seed": seed, "steps": len(steps), "mismatch": mean("mismatch"),
            "mismatch_max": max(r["mismatch"] for r in steps), "mismatch_kl": mean("mismatch_kl"),
            "reward_last10": mean("reward/mean", steps[-10:]), "accuracy_after": evals[-1] if evals else None,
            "s_per_step": mean("time/step"), "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| routing replay | seeds | mismatch (mean per token) | KL(sampler‖learner) per token | reward, last 10 steps | "
           "held-out accuracy | s/step | CPU s/run |", "|---|---|---|---|---|---|---|---|"]
    for replay in (False, True):
        arm = [r for r in rows if r["replay"] == replay]
        if not arm:
            continue
        acc = [r["accuracy_after"] for r in arm if r["accuracy_after"] is not None]
        cell = lambda key, fmt: " / ".join(format(r[key], fmt) for r in arm)  # noqa: E731
        out.append(f"| {'on' if replay else 'off'} | {len(arm)} | {cell('mismatch', '.4f')} | "
                   f"{cell('mismatch_kl', '.5f')} | {cell('reward_last10', '.3f')} | "
                   f"{' / '.join(f'{a:.3f}' for a in acc)} (mean {statistics.fmean(acc):.3f}) | "
                   f"{statistics.fmean(r['s_per_step'] for r in arm):.1f} | "
                   f"{statistics.fmean(r['cpu_s'] for r in arm):.0f} |" if acc else "")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--replay", choices=("off", "on", "both"), default="both",
                        help="the arms to run (one arm per process lets runs go side by side into separate --out)")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.1, help="expert noise, x each weight's RMS")
    parser.add_argument("--eval-limit", type=int, default=200)
    parser.add_argument("--set", nargs="*", default=[], help="more key=value overrides for every run")
    parser.add_argument("--merge", type=Path, nargs="+", default=[],
                        help="only write OUT/results.json and .md from these directories' results.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        rows = sorted((r for d in args.merge for r in json.loads((d / "results.json").read_text())),
                      key=lambda r: (r["replay"], r["seed"]))
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))
        (args.out / "results.md").write_text(markdown(rows))
        print(markdown(rows))
        return
    model = upcycle_directory(resolve_model("smollm2-135m-instruct"),
                              args.out / f"smollm2-moe-e{args.experts}-k{args.top_k}-n{args.noise}",
                              experts=args.experts, top_k=args.top_k, noise=args.noise)
    done = args.out / "results.json"
    rows: list[dict[str, Any]] = json.loads(done.read_text()) if done.exists() else []  # runs finished before
    for seed in args.seeds:
        for replay in [arm for arm in (False, True) if args.replay in ("both", "on" if arm else "off")]:
            if any(r["seed"] == seed and r["replay"] == replay and r["steps"] == args.steps for r in rows):
                continue
            rows.append(one_run(model, args.out, replay, seed, args))
            (args.out / "results.json").write_text(json.dumps(rows, indent=1))
            (args.out / "results.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
