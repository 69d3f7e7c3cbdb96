"""Synchronous vs asynchronous RL on this CPU: the default task with 1 Ray rollout worker pinned to
core 0 and the learner (this process) pinned to core 1, for pipeline.max_staleness in --staleness
(0 is the synchronous loop), over --seeds. Per run: seconds per step, generated tokens per second,
held-out accuracy after the last step, the worker's and the learner's busy fractions, the weight
push and load times, the groups the learner streamed, the lag histogram (`--set
pipeline.chunk_groups=2` splits each round into jobs of 2 groups, which the learner streams);
writes OUT/results.json, OUT/results.md (markdown rows) and each run's timeline PNG.

    PYTHONPATH=$PWD python benchmarks/async_overlap.py --steps 40 --seeds 0 1 --staleness 0 1 2 --out /tmp/async
    PYTHONPATH=$PWD python benchmarks/async_overlap.py --steps 3 --seeds 0 --eval-limit 20   # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from upslope.config import load_config
from upslope.logs.plot import plot_timeline
from upslope.launch import run_trainer


def one_run(out: Path, staleness: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One training run of the arm; its summary row."""
    run_dir = out / f"staleness{staleness}-seed{seed}"
    cfg = load_config(args.recipe, [
        f"run_dir={run_dir}", f"train.steps={args.steps}", f"train.seed={seed}", f"engine.seed={seed}",
        f"engine.name={args.engine}", "train.threads=1", "log.progress=false", "log.tensorboard=false",
        "train.eval_before=false", "train.eval_every=0", f"eval.limit={args.eval_limit}",
        "dist.rollout_workers=1", f"dist.worker_cores=[{args.worker_core}]", f"pipeline.max_staleness={staleness}",
        *args.set])
    result = run_trainer("train", cfg)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    seconds = sum(r["time/step"] for r in steps)
    lags: dict[str, float] = {}
    for r in steps:
        for k, v in r.items():
            if k.startswith("pipeline/lag_"):
                lags[k.removeprefix("pipeline/lag_")] = lags.get(k.removeprefix("pipeline/lag_"), 0.0) + v
    events = [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines()]
    plot_timeline(events, run_dir / "timeline.png", title=f"max_staleness={staleness}, seed {seed}")
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in steps)  # noqa: E731
    return {"staleness": staleness, "seed": seed, "steps": len(steps), "s_per_step": seconds / len(steps),
            "s_per_step_after_1": statistics.fmean(r["time/step"] for r in steps[1:]) if len(steps) > 1 else None,
            "tokens_per_s": sum(r["rollout/generated_tokens"] for r in steps) / seconds,
            "accuracy_after": result.get("after", {}).get("accuracy"),
            "worker_busy": mean("pipeline/worker0_busy"), "learner_busy": mean("pipeline/learner_busy"),
            "weight_push_s": mean("pipeline/weight_push_s"), "weight_load_s": mean("pipeline/weight_load_s"),
            "streamed_groups": sum(r.get("pipeline/streamed_groups", 0.0) for r in steps), "lag_groups": lags,
            "dropped_stale_groups": sum(r.get("pipeline/dropped_stale_groups", 0.0) for r in steps),
            "timeline": str(run_dir / "timeline.png")}


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| max_staleness | seed | steps | s/step | s/step (after step 1) | tokens/s | held-out acc | worker busy | "
            "learner busy | push s | load s | streamed groups | groups by lag |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    return head + "".join(
        f"| {r['staleness']} | {r['seed']} | {r['steps']} | {f(r['s_per_step'])} | {f(r['s_per_step_after_1'])} | "
        f"{f(r['tokens_per_s'], '.1f')} | {f(r['accuracy_after'], '.3f')} | {f(r['worker_busy'])} | "
        f"{f(r['learner_busy'])} | {f(r['weight_push_s'], '.3f')} | {f(r['weight_load_s'], '.3f')} | "
        f"{r['streamed_groups']:.0f} | "
        f"{', '.join(f'{k}: {v:.0f}' for k, v in sorted(r['lag_groups'].items()))} |\n" for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--recipe", default=None, help="recipe file (default: the default task)")
    ap.add_argument("--engine", default="hf", help="engine.name of the worker and of evaluation")
    ap.add_argument("--eval-limit", type=int, default=200)
    ap.add_argument("--worker-core", type=int, default=0)
    ap.add_argument("--learner-core", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], help="more config overrides")
    ap.add_argument("--out", type=Path, default=Path("/tmp/async_overlap"))
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.learner_core})  # the learner; Ray's processes are started after this
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for staleness in args.staleness:
            rows.append(one_run(args.out, staleness, seed, args))
            (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                               "rows": rows}, indent=1) + "\n")
            (args.out / "results.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
