"""Cost of the token-salience passes (FlowTracer, GRAIL, ARCA) against the learner's plain no-grad
scoring pass, in tokens/s on the same batch: the extra work a salience-weighted advantage adds a step.

    python benchmarks/salience_cost.py [--model smollm2-135m-instruct] [--rows 32] [--prompt 24] [--completion 8]

Prints one JSON line per pass (median of --repeats interleaved rounds) and the ratio to plain scoring.
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


def interleaved(passes: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each pass over `repeats` rounds, the passes interleaved within each round (so a
    change of load on a shared CPU hits every pass alike), after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in passes}
    for r in range(repeats + 1):
        for name, fn in passes.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


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
        passes = {}
        for lora in (False, True):
            cfg = load_config(None, [f"model.name={path}", f"run_dir={run_dir}", "train.precision=float32",
                                     f"lora.enabled={str(lora).lower()}"])
            up = Updater.from_config(cfg, path, "cpu")
            passes["plain_lora" if lora else "plain"] = lambda up=up: up.score(batch, temperature=1.0)
            for source in (("adapter_residual",) if lora else ("attention_flow", "gradient")):
                passes[source] = lambda s=source, up=up: token_salience(up, batch, s, 3)
        results = interleaved(passes, args.repeats)
        for name, sec in results.items():
            base = results["plain_lora" if name in ("adapter_residual", "plain_lora") else "plain"]
            print(json.dumps({"pass": name, "seconds": round(sec, 3), "tokens_per_s": round(tokens / sec, 1),
                              "x_plain": round(sec / base, 2), "tokens": tokens, "model": args.model,
                              "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
