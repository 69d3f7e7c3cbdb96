"""Train every recipe for N steps on its default task and tabulate held-out accuracy at
step 0 and step N, seconds per step, and each recipe's telling metric.

    python benchmarks/recipes_table.py [--steps 30] [--seed 0] [--recipes grpo dapo ...] [--out results/recipes.json]
    python benchmarks/recipes_table.py --steps 30 --summarize RUNS/grpo-s0 RUNS/dapo-s1   # finished runs only

Each recipe runs in its own process (`upslope train`); step 0 accuracy is measured once
(the base model is the same for every recipe).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRA = {"dapo": ["filter/groups_dropped", "rollout/prompts_drawn"], "gdpo": ["adv/std"], "ppo": ["critic/loss"]}


def rl_recipes() -> list[str]:
    """Recipes of `upslope train` (not those configuring sft, rft, dpo or distill)."""
    import yaml

    def rl(path: Path) -> bool:
        raw = yaml.safe_load(path.read_text()) or {}
        if any(k in raw for k in ("sft", "rft", "dpo", "distill")):
            return False
        return rl(path.parent / raw["base"]) if raw.get("base") else True

    return sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml") if rl(p))


def run(recipe: str, steps: int, run_dir: Path, eval_before: bool, seed: int = 0,
        extra: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, "-m", "upslope.cli", "train", str(ROOT / "recipes" / f"{recipe}.yaml"),
           f"train.steps={steps}", f"train.seed={seed}", f"engine.seed={seed}", "train.eval_every=0", f"train.eval_before={str(eval_before).lower()}",
           f"run_dir={run_dir}", "log.progress=false", "log.tensorboard=false", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"recipe": recipe, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return summarize(recipe, seed, run_dir, steps, wall)


def summarize(recipe: str, seed: int, run_dir: Path, steps: int, wall: float | None = None) -> dict:
    """One table row from a finished run's metrics.jsonl (accuracy at steps 0 and N, step time, reward)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "time/step" in r]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    out = {"recipe": recipe, "seed": seed, "acc_before": evals.get(0), "acc_after": evals.get(steps),
           "s_per_step": round(statistics.median(r["time/step"] for r in steps_rows), 2),
           "wall_s": None if wall is None else round(wall, 1),
           "reward_first5": round(statistics.mean(r.get("reward/mean", 0) for r in steps_rows[:5]), 3),
           "reward_last5": round(statistics.mean(r.get("reward/mean", 0) for r in steps_rows[-5:]), 3)}
    for key in EXTRA.get(recipe, []):
        vals = [r[key] for r in steps_rows if key in r]
        if vals:
            out[key] = round(statistics.mean(vals), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--recipes", nargs="*", default=rl_recipes(), help="default: every RL recipe (upslope train)")
    ap.add_argument("--seed", type=int, default=0, help="train.seed and engine.seed of every run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override passed to every run (e.g. train.threads=1)")
    ap.add_argument("--work", default="/tmp/upslope-recipes")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recipes.json"))
    ap.add_argument("--summarize", nargs="+", type=Path, default=None, metavar="RUN_DIR",
                    help="run nothing: tabulate these finished run directories (named RECIPE-sSEED)")
    a = ap.parse_args()
    results = []
    if a.summarize:
        for run_dir in a.summarize:
            recipe, _, seed = run_dir.name.rpartition("-s")
            results.append(summarize(recipe, int(seed), run_dir, a.steps))
            print(json.dumps(results[-1]), flush=True)
    for i, recipe in enumerate([] if a.summarize else a.recipes):
        r = run(recipe, a.steps, Path(a.work) / f"{recipe}-s{a.seed}", eval_before=(i == 0), seed=a.seed,
                extra=tuple(a.set))
        results.append(r)
        print(json.dumps(r), flush=True)
    base = next((r["acc_before"] for r in results if r.get("acc_before") is not None), None)
    print(f"\n| recipe | held-out acc, step 0 | step {a.steps} | s/step | train reward, first 5 -> last 5 steps | notes |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['recipe']} | | | | | failed: {r['error']} |")
            continue
        notes = ", ".join(f"{k}={v}" for k, v in r.items() if "/" in k)
        print(f"| {r['recipe']} | {base} | {r['acc_after']} | {r['s_per_step']} | {r['reward_first5']} -> "
              f"{r['reward_last5']} | {notes} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
