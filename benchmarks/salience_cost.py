"""Cost of the token-salience passes (FlowTracer, GRAIL, ARCA) against the learner's plain no-grad
scoring pass, in tokens/s on the same batch: the extra work a salience-weighted advantage adds a step.

    python benchmarks/salience_cost.py [--model smollm2-135m-instruct] [--rows 32] [--prompt 24] [--completion 8]

Prints one JSON line per pass (median of --repeats timings) and the ratio to plain scoring.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from upslope.batch import build_batch
from upslope.config import load_config
from upslope.models import resolve_model
from upslope.train.learner.salience import token_salience
from upslope.train.learner.updater import Updater


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=24)
    ap.add_argument("--completion", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    path = resolve_model(args.model)
    n = args.rows
    prompts = torch.randint(100, 20000, (n, args.prompt)).tolist()
    comps = torch.randint(100, 20000, (n, args.completion)).tolist()
    batch = build_batch(prompts, comps, [[-1.0] * args.completion] * n, list(range(n)), [False] * n, pad_id=0)
    tokens = n * (args.prompt + args.completion)
    with tempfile.TemporaryDirectory() as run_dir:
        results = {}
        for lora in (False, True):
            cfg = load_config(None, [f"model.name={path}", f"run_dir={run_dir}", "train.precision=float32",
                                     f"lora.enabled={str(lora).lower()}"])
            up = Updater.from_config(cfg, path, "cpu")
            passes = {"plain_lora" if lora else "plain": lambda: up.score(batch, temperature=1.0)}
            for source in (("adapter_residual",) if lora else ("attention_flow", "gradient")):
                passes[source] = lambda s=source: token_salience(up, batch, s, 3)
            for name, fn in passes.items():
                results[name] = timed(fn, args.repeats)
        for name, sec in results.items():
            base = results["plain_lora" if name in ("adapter_residual", "plain_lora") else "plain"]
            print(json.dumps({"pass": name, "seconds": round(sec, 3), "tokens_per_s": round(tokens / sec, 1),
                              "x_plain": round(sec / base, 2), "tokens": tokens, "model": args.model,
                              "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
