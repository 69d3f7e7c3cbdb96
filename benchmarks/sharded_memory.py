"""The sharded learner on the real SmolLM2-135M, on this CPU: 3 RL updates of the same batch in
one process and in 2 gloo ranks (ddp, fsdp); prints the max abs weight difference to the
one-process run, each rank's parameter + gradient + AdamW-state bytes and peak RSS, and the median
update time. Peak RSS is read (ru_maxrss) twice: once the learner is built (rank 0 alone reads
the weights; the other ranks receive their shards) and after the updates, before rank 0 gathers
the full weights for the comparison. With --lora the policy trains a LoRA adapter (only its
parameters have gradients and AdamW state; FSDP shards the frozen base weights too); with --kl
the RL loss has a KL term, so each rank also holds the frozen reference (its shards under FSDP).

    PYTHONPATH=$PWD python benchmarks/sharded_memory.py [--rows 8] [--tokens 48] [--steps 3] [--lora] [--kl]
        [--learners 1 ddp fsdp] [--out /tmp/sharded]
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
from upslope.distributed import group
from upslope.distributed.shard import plain
from upslope.models import resolve_model
from upslope.train.learner.objectives import RLObjective
from upslope.train.trainers.rl import with_reference
from upslope.train.learner.updater import Updater

LEARNERS = {"1": ("1 process", 1, "ddp"), "ddp": ("2 ranks ddp", 2, "ddp"), "fsdp": ("2 ranks fsdp", 2, "fsdp")}


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


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(path: str, strategy: str, rows: int, tokens: int, out: str, lora: bool = False, kl: bool = False,
        steps: int = 3) -> None:
    """One rank (or the one process): `steps` updates, then its numbers (and rank 0 the full weights) under `out`."""
    group.init_from_env("gloo", torch.device("cpu"))
    torch.set_num_threads(max(2 // group.world(), 1))
    cfg = load_config(None, [f"model.name={path}", "model.dtype=float32", "train.precision=float32",
                             "optim.lr=1e-5", "train.micro_batch_tokens=256", f"dist.strategy={strategy}",
                             f"dist.learner_procs={group.world()}", f"lora.enabled={str(lora).lower()}",
                             f"algo.kl_coef={0.05 if kl else 0.0}"])
    torch.manual_seed(0)  # the same LoRA adapter initialisation in the one process as on rank 0
    updater = Updater.from_config(cfg, path, "cpu")
    objective = RLObjective.from_config(cfg)
    if objective.needs_reference:  # --kl
        updater.reference()
    loaded_rss = peak_rss()
    grad_bytes: list[int] = []
    updater.optimizer.register_step_pre_hook(
        lambda *_: grad_bytes.append(local_bytes(p.grad for p in updater.model.parameters() if p.grad is not None)))
    batch, times = rl_batch(rows, tokens), []
    if objective.needs_reference:  # --kl: the reference's log-probs
        batch = with_reference(batch, updater, objective.temperature, kl_reward=None)[0]
    for step in range(1, steps + 1):
        start = time.perf_counter()
        updater.update(batch, step, objective)
        times.append(time.perf_counter() - start)
    state = [t for s in updater.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    reference = local_bytes(updater.reference().parameters()) if kl and not lora else 0
    numbers = {"rank": group.rank(), "params": local_bytes(updater.model.parameters()), "grads": max(grad_bytes),
               "optim": local_bytes(state), "reference": reference, "loaded_rss": loaded_rss,
               "peak_rss": peak_rss(), "update_s": statistics.median(times)}
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
    ap.add_argument("--steps", type=int, default=3, help="RL updates of the batch")
    ap.add_argument("--lora", action="store_true",
                    help="train a LoRA adapter (lora.* defaults) instead of every weight")
    ap.add_argument("--kl", action="store_true", help="a KL term (algo.kl_coef=0.05): each rank holds the reference")
    ap.add_argument("--learners", nargs="+", choices=list(LEARNERS), default=list(LEARNERS),
                    help="which learners to run (the weight difference is to the first one run)")
    ap.add_argument("--out", default="/tmp/sharded_memory")
    args = ap.parse_args()
    path = resolve_model(args.model)
    gib = 2 ** 30
    reference = None
    print("| learner | rank | params GiB | grads GiB | AdamW state GiB | sum GiB | reference GiB | "
          "peak RSS loaded GiB | peak RSS GiB | update s | max abs weight diff |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name, procs, strategy in (LEARNERS[k] for k in args.learners):
        out = Path(args.out) / name.replace(" ", "_")
        out.mkdir(parents=True, exist_ok=True)
        group.spawn(run, procs, path, strategy, args.rows, args.tokens, str(out), args.lora, args.kl, args.steps)
        weights = torch.load(out / "weights.pt")
        reference = reference or weights
        diff = max(float((weights[k] - reference[k]).abs().max()) for k in reference)
        for r in range(procs):
            n = json.loads((out / f"rank{r}.json").read_text())
            total = n["params"] + n["grads"] + n["optim"]
            print(f"| {name} | {r} | {n['params'] / gib:.3f} | {n['grads'] / gib:.3f} | {n['optim'] / gib:.3f} | "
                  f"{total / gib:.3f} | {n['reference'] / gib:.3f} | {n['loaded_rss'] / gib:.2f} | "
                  f"{n['peak_rss'] / gib:.2f} | {n['update_s']:.1f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main()
