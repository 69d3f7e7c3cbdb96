"""Rollout time of one multi-turn task with turns in lockstep (`multi_turn`), without (`multi_turn_unlocked`),
and as an OpenAI-client agent program (`openai_agent`), on one engine with the same weights, arms
interleaved round by round so that the machine's load falls on each alike.

    python benchmarks/agent_lockstep.py recipes/agent_python.yaml --rounds 4 \
        --program examples/agents/python_tool_agent.py:agent --out runs/agent_lockstep.json

Per arm: the median and every round's rollout seconds, the first reward part's mean (accuracy), turns and
tokens per trajectory. The same prompts and sampling settings each round (the seed changes per round)."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from upslope.config import load_config
from upslope.data import load_examples
from upslope.engine import SamplingParams
from upslope.runtime import Runtime
from upslope.rollout.plugin import make_rollout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--program", default="", help="also time this agent program ('file.py:function') as openai_agent")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="a config override, e.g. --set engine.name=hf")
    a = ap.parse_args()
    base = ["run_dir=/tmp/agent_lockstep", *a.set]
    arms = {"lockstep": ["rollout.kind=multi_turn"], "unlocked": ["rollout.kind=multi_turn_unlocked"]}
    if a.program:
        arms["openai_agent"] = ["rollout.kind=openai_agent", f"rollout.options={{agent: {a.program}}}"]
    cfgs = {name: load_config(a.recipe, base + extra) for name, extra in arms.items()}
    first = next(iter(cfgs.values()))
    runtime = Runtime.create(first)
    engine = runtime.engine
    r = first.rollout
    examples = load_examples(first.data, "train")[: r.prompts_per_step]
    rollouts = {name: make_rollout(cfg, runtime.tokenizer) for name, cfg in cfgs.items()}
    results: dict[str, dict] = {name: {"seconds": [], "accuracy": [], "turns": [], "tokens": []} for name in arms}
    for rnd in range(a.rounds):
        order = list(arms) if rnd % 2 == 0 else list(reversed(arms))
        for name in order:
            params = SamplingParams(n=r.n, temperature=r.temperature, max_new_tokens=r.max_new_tokens, seed=100 + rnd,
                                    stop_token_ids=runtime.stop_ids)
            start = time.perf_counter()
            batch = rollouts[name](engine, [], examples, params, runtime.tokenizer.pad_token_id)
            seconds = time.perf_counter() - start
            parts = [m.get("reward_parts") or {} for m in batch.meta]
            first_part = [next(iter(p.values()), 0.0) for p in parts]
            res = results[name]
            res["seconds"].append(round(seconds, 2))
            res["accuracy"].append(round(statistics.fmean(v >= 0.5 for v in first_part), 3))
            res["turns"].append(round(statistics.fmean(m["metrics"]["agent/turns"] for m in batch.meta), 2))
            res["tokens"].append(round(float(batch.completion_lens.float().mean()), 1))
            print(f"round {rnd} {name}: {seconds:.1f} s, accuracy {res['accuracy'][-1]}, rows {batch.size}", flush=True)
    summary = {name: {"median_s": statistics.median(res["seconds"]), "mean_accuracy": round(statistics.fmean(res["accuracy"]), 3),
                      **res} for name, res in results.items()}
    a.out.write_text(json.dumps(summary, indent=2))
    for name, s in summary.items():
        print(f"{name}: median {s['median_s']} s per rollout, accuracy {s['mean_accuracy']}")
    runtime.close()


if __name__ == "__main__":
    main()
