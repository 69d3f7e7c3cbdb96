"""The sharded learner on the real SmolLM2-135M, on this CPU: 3 RL updates of the same batch in
one process and in 2 gloo ranks (ddp, fsdp); prints the max abs weight difference to the
one-process run, each rank's parameter + gradient + AdamW-state bytes and peak RSS, and the median
update time. With --lora the policy trains a LoRA adapter (only its parameters have gradients
and AdamW state; FSDP shards the frozen base weights too).

    PYTHONPATH=$PWD python benchmarks/sharded_memory.py [--rows 8] [--tokens 48] [--lora] [--out /tmp/sharded]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch

from upslope.batch import Batch, build_batch
from upslope.config import load_config
from upslope.dist import group
from upslope.dist.shard import plain
from upslope.models import resolve_model
from upslope.train.learner.objectives import RLObjective
from upslope.train.learner.updater import Updater

STEPS = 3


def rl_batch(rows: int, tokens: int) -> Batch:
    """Groups of 4 rows sharing a 16-token prompt, completions of varied length up to `tokens`, advantages +-1."""
    gen = torch.Generator().manual_seed(0)
    prompts, comps, gids = [], [], []
    for r in range(rows):
        g = r // 4
        prompts.append(torch.randint(5, 40000, (16,), generator=torch.Generator().manual_seed(g)).tolist())
        comps.append(torch.randint(5, 40000, (tokens - 16 - (r % 4) * 4,), generator=gen).tolist())
        gids.append(g)
    b = build_batch(prompts, comps, [[-1.0] * len(c) for c in comps], gids, [False] * rows, pad_id=0)
    b.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5] * (rows // 4))[:, None] * b.loss_mask
    return b


def local_bytes(tensors) -> int:
    return sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes for t in tensors)


def run(path: str, strategy: str, rows: int, tokens: int, out: str, lora: bool = False) -> None:
    """One rank (or the one process): 3 updates, then its numbers (and rank 0 the full weights) under `out`."""
    group.init_from_env("gloo", torch.device("cpu"))
    torch.set_num_threads(max(2 // group.world(), 1))
    cfg = load_config(None, [f"model.name={path}", "model.dtype=float32", "train.precision=float32",
                             "optim.lr=1e-5", "train.micro_batch_tokens=256", f"dist.strategy={strategy}",
                             f"dist.learner_procs={group.world()}", f"lora.enabled={str(lora).lower()}"])
    torch.manual_seed(0)  # the same LoRA adapter initialisation in the one process as on rank 0
    updater = Updater.from_config(cfg, path, "cpu")
    objective = RLObjective.from_config(cfg, updater)
    grad_bytes: list[int] = []
    updater.optimizer.register_step_pre_hook(
        lambda *_: grad_bytes.append(local_bytes(p.grad for p in updater.model.parameters() if p.grad is not None)))
    batch, times = rl_batch(rows, tokens), []
    for step in range(1, STEPS + 1):
        start = time.perf_counter()
        updater.update(batch, step, objective)
        times.append(time.perf_counter() - start)
    state = [t for s in updater.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    numbers = {"rank": group.rank(), "params": local_bytes(updater.model.parameters()), "grads": max(grad_bytes),
               "optim": local_bytes(state), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "update_s": statistics.median(times)}
    weights = {n: plain(p.detach()) for n, p in updater.model.named_parameters()}
    out_dir = Path(out)
    (out_dir / f"rank{group.rank()}.json").write_text(json.dumps(numbers))
    if group.is_main():
        torch.save(weights, out_dir / "weights.pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--lora", action="store_true",
                    help="train a LoRA adapter (lora.* defaults) instead of every weight")
    ap.add_argument("--out", default="/tmp/sharded_memory")
    args = ap.parse_args()
    path = resolve_model(args.model)
    gib = 2 ** 30
    reference = None
    print("| learner | rank | params GiB | grads GiB | AdamW state GiB | sum GiB | peak RSS GiB | update s | "
          "max abs weight diff vs 1 process |\n|---|---|---|---|---|---|---|---|---|")
    for name, procs, strategy in (("1 process", 1, "ddp"), ("2 ranks ddp", 2, "ddp"), ("2 ranks fsdp", 2, "fsdp")):
        out = Path(args.out) / name.replace(" ", "_")
        out.mkdir(parents=True, exist_ok=True)
        group.spawn(run, procs, path, strategy, args.rows, args.tokens, str(out), args.lora)
        weights = torch.load(out / "weights.pt")
        reference = reference or weights
        diff = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
        for r in range(procs):
            n = json.loads((out / f"rank{r}.json").read_text())
            total = n["params"] + n["grads"] + n["optim"]
            print(f"| {name} | {r} | {n['params'] / gib:.3f} | {n['grads'] / gib:.3f} | {n['optim'] / gib:.3f} | "
                  f"{total / gib:.3f} | {n['peak_rss'] / gib:.2f} | {n['update_s']:.1f} | {diff:.2e} |")


if __name__ == "__main__":
    main()
