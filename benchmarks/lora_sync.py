"""Weight-sync cost of LoRA against full fine-tuning: what `Updater.named_weights()` yields
(tensors, parameters) and how long building it and pushing it into the rollout engine take.

Full fine-tuning pushes every parameter; LoRA pushes the merged blocks that hold an adapter
(W + scale * B @ A, computed without touching the training model). One engine (vLLM when
importable, else HF) receives both in turn; medians of --repeats pushes each.

Usage:
  nice -n 19 python benchmarks/lora_sync.py                         # SmolLM2-135M, default targets
  nice -n 19 python benchmarks/lora_sync.py lora.target_modules=[q_proj,v_proj]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from upslope.config import load_config
from upslope.models import load_tokenizer, resolve_model
from upslope.rollout.engines import make_engine
from upslope.train.learner.updater import Updater


def timed_push(learner: Updater, engine: Any, repeats: int) -> dict[str, float]:
    build, push, tensors, params = [], [], 0, 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        weights = list(learner.named_weights())
        t1 = time.perf_counter()
        engine.update_weights(weights)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        push.append(t2 - t1)
        tensors, params = len(weights), sum(t.numel() for _, t in weights)
    return {"tensors": tensors, "params": params, "build_s": round(statistics.median(build), 3),
            "push_s": round(statistics.median(push), 3),
            "sync_s": round(statistics.median(b + p for b, p in zip(build, push)), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs (model.name=..., lora.*)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg_full = load_config(None, [*args.overrides, "lora.enabled=false"])
    cfg_lora = load_config(None, [*args.overrides, "lora.enabled=true"])
    path = resolve_model(cfg_full.model.name, cfg_full.model.gguf_file, cfg_full.model.cache_dir)
    engine = make_engine(cfg_full.engine, path, load_tokenizer(path), cfg_full.model.dtype, 512)
    out: dict[str, Any] = {"model": cfg_full.model.name, "engine": engine.name,
                           "targets": cfg_lora.lora.target_modules, "rank": cfg_lora.lora.rank}
    try:
        for label, cfg in (("full", cfg_full), ("lora", cfg_lora)):
            learner = Updater.from_config(cfg, path, "cpu")
            with torch.no_grad():  # a trained adapter: B != 0 (timing does not depend on the values)
                for name, p in learner.model.named_parameters():
                    if ".lora_B." in name:
                        p.normal_(0, 1e-3)
            out[label] = timed_push(learner, engine, args.repeats)
            out[label]["trainable_params"] = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
            del learner
    finally:
        engine.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
