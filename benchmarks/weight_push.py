"""What a weight push to the Ray rollout workers costs: the learner's `put_weights` (the fp32 state
dict into the object store, once per version) and each worker's `set_weights` (reading it out of the
object store and copying it into its engine), for --workers HF workers on one node, --pushes times.

    PYTHONPATH=$PWD nice -n 19 python benchmarks/weight_push.py --workers 2 --pushes 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from upslope.config import load_config
from upslope.distributed.ray_workers import put_weights, spawn_workers
from upslope.models import load_model, load_tokenizer, resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides (e.g. model.name=...)")
    args = ap.parse_args()
    import ray

    cfg = load_config(None, ["engine.name=hf", "train.threads=1", f"dist.rollout_workers={args.workers}", *args.set])
    path = resolve_model(cfg.model.name, cfg.model.gguf_file, cfg.model.cache_dir, lambda *_: None)
    model = load_model(path, "float32")
    mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    ray.init(num_cpus=max(args.workers, 2), include_dashboard=False, log_to_driver=False)
    try:
        workers = spawn_workers(cfg, load_tokenizer(path).pad_token_id)
        ray.get([w.pid.remote() for w in workers])
        put_s, load_s = [], []
        for version in range(1, args.pushes + 1):
            t0 = time.perf_counter()
            ref = put_weights(model.named_parameters())
            t1 = time.perf_counter()
            ray.get([w.set_weights.remote(version, ref) for w in workers])
            put_s.append(t1 - t0)
            load_s.append(time.perf_counter() - t1)
            del ref
        print(json.dumps({"state_dict_mib": round(mib, 1), "workers": args.workers, "pushes": args.pushes,
                          "put_s": [round(x, 3) for x in put_s], "set_weights_all_workers_s": [round(x, 3) for x in load_s],
                          "put_median_s": round(statistics.median(put_s), 3),
                          "set_weights_median_s": round(statistics.median(load_s), 3)}))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
