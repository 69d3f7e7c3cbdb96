"""Packed against padded learner micro-batches (train.packing) at mixed and uniform reply lengths.

For each reply length and each layout (`mixed`: one reply per group at the full length, the others at
1/16..1/4 of it; `uniform`: every reply at the full length), one learner update of `--prompts` GSM8K
prompts x `--n` replies (random ids) runs padded and packed, each in a fresh process, the two arms
alternating over `--repeats`. Reported per arm: seconds per update (median; `--cpu-time`: the process's
CPU seconds instead of wall time, steadier on a shared machine with `--threads 1`), the fraction of the
compute bound (the matmul rate measured in the same run, as benchmarks/roofline.py counts it), the token
slots the micro-batches occupy (padding included), peak resident memory, and the loss of the first
update (the same batch and weights: the arms must agree to rounding).

    python benchmarks/packing.py                            # lengths 128,512; mixed and uniform; 2 repeats
    python benchmarks/packing.py --lengths 64 --prompts 2 --n 4 --repeats 1      # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import roofline  # noqa: E402

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--lengths", default="128,512", help="comma list of reply lengths")
    p.add_argument("--layouts", default="mixed,uniform", help="comma list of mixed, uniform")
    p.add_argument("--prompts", type=int, default=8, help="GSM8K prompts per batch")
    p.add_argument("--n", type=int, default=8, help="replies per prompt")
    p.add_argument("--repeats", type=int, default=2, help="runs of each arm (alternating)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="learner precision")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: every core)")
    p.add_argument("--override", action="append", default=[], help="extra upslope key=value for both arms")
    p.add_argument("--cpu-time", action="store_true", help="time by the worker's CPU seconds, not wall time")
    p.add_argument("--out", help="results JSON (default benchmarks/results/packing-<time>.json)")
    a = p.parse_args(argv)
    if a.model is None:
        from upslope.models import resolve_model

        a.model = resolve_model("smollm2-135m-instruct", announce=lambda m: print(m, file=sys.stderr))
    console, peak, cpu, flags = roofline.machine_bound(a)
    shape = roofline.model_shape(a.model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = HERE / "results" / f"packing-{stamp}"
    common = [sys.executable, roofline.__file__, "--worker", "learner", "--model", a.model, "--prompts", str(a.prompts),
              "--n", str(a.n), "--dtype", a.dtype, "--threads", str(a.threads),
              *sum((["--override", o] for o in a.override), [])]
    cells: list[dict[str, Any]] = []
    for length in [int(x) for x in a.lengths.split(",") if x]:
        for layout in [x for x in a.layouts.split(",") if x]:
            runs: dict[str, list[dict[str, Any]]] = {"padded": [], "packed": []}
            for r in range(a.repeats):
                for arm in ("padded", "packed"):
                    cmd = common + ["--length", str(length), "--override", f"train.packing={arm == 'packed'}"]
                    cmd += ["--mixed"] if layout == "mixed" else []
                    run = benchlib.run_worker(cmd, logs / f"{length}-{layout}-{arm}-{r}.log", timeout=3600)
                    done = next((x for x in run["records"] if x.get("event") == "done"), None)
                    if done is None:
                        raise SystemExit(f"{arm} at {length} ({layout}) failed:\n{benchlib.tail(run['log'], 8)}")
                    done["peak_rss_gib"] = run["peak_rss_gib"]
                    runs[arm].append(done)
            cell: dict[str, Any] = {"length": length, "layout": layout}
            for arm, done in runs.items():
                clock = "cpu_seconds" if a.cpu_time else "seconds"
                seconds = statistics.median(d[clock] for d in done)
                flops = roofline.learner_flops(shape, done[0]["forwarded"], done[0]["rows"], done[0]["recompute"])
                cell[arm] = {"seconds": seconds, "fraction": flops / peak / seconds,
                             "token_slots": done[0]["padded_tokens"], "forwarded": done[0]["forwarded"],
                             "peak_rss_gib": max(d["peak_rss_gib"] for d in done), "loss": done[0]["loss"],
                             "all_seconds": [d["seconds"] for d in done],
                             "all_cpu_seconds": [d["cpu_seconds"] for d in done]}
            cell["time_ratio"] = cell["packed"]["seconds"] / cell["padded"]["seconds"]
            cell["loss_difference"] = abs(cell["packed"]["loss"] - cell["padded"]["loss"])
            cells.append(cell)
            pa, pk = cell["padded"], cell["packed"]
            console.print(f"  {length:4d} {layout:7s}: padded {pa['seconds']:.2f} s ({pa['fraction']:.0%}, "
                          f"{pa['token_slots']} slots, {pa['peak_rss_gib']:.2f} GiB) | packed {pk['seconds']:.2f} s "
                          f"({pk['fraction']:.0%}, {pk['token_slots']} slots, {pk['peak_rss_gib']:.2f} GiB) | "
                          f"packed/padded {cell['time_ratio']:.2f}x, loss diff {cell['loss_difference']:.1e}")
    out = Path(a.out) if a.out else HERE / "results" / f"packing-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "packing", "cpu": cpu, "flags": sorted(flags), "threads": a.threads,
                               "dtype": a.dtype, "clock": "cpu" if a.cpu_time else "wall", "matmul_flops": peak, "shape": shape, "prompts": a.prompts, "n": a.n,
                               "machine": benchlib.machine_info(), "cells": cells}, indent=1))
    console.print(f"[dim]wrote {out}[/dim]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
