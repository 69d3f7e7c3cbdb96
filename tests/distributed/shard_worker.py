"""One learner rank of the sharded-learner tests (imported by the spawned processes): a fixed RL
batch, 3 updates, then the first step's gradients, the losses, the weights and the weight push
(what it sends, and how much of it is alive at once) written by rank 0, a DCP checkpoint, and
optionally a 4th update after resuming from another run's checkpoint."""
from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch

from batch_helpers import grouped_rl_batch

from upslope.batch import Batch
from upslope.config import Config, load_config
from upslope.distributed import group
from upslope.distributed.shard import plain
from upslope.train.learner.objectives import Objective, RLObjective, SupervisedObjective
from upslope.train.learner.updater import Updater
from upslope.train.trainers.rl import with_reference

STEPS = 3


def rl_batch(groups: int = 4, n: int = 3) -> Batch:
    """Groups of `n` rows sharing a prompt, lengths varied (micro-batches of different sizes),
    advantages +a, -a, 0, ... (one group all 0: its rows are skipped)."""
    return grouped_rl_batch([1.0, 0.5, 0.0, -2.0][:groups], n, seed=0, length_cycle=5)


SFT = "objective=sft"  # a variant's marker (not a config override): `upslope rft`'s update, the SFT loss
SFT_PASSES = {"updates": 2, "epochs": 2}  # rft's mini-batches and passes over the kept samples


def config(path: str, strategy: str, *overrides: str) -> Config:
    """The tests' learner config: fp32, lr 1e-3, 40-token micro-batches, this group's rank count."""
    return load_config(None, [f"model.name={path}", "train.precision=float32", "optim.lr=1e-3", "optim.eps=1e-4",
                              "train.micro_batch_tokens=40", f"dist.strategy={strategy}",
                              f"dist.learner_procs={group.env_world_size()}", *overrides])


def learner(path: str, strategy: str, *extra: str) -> tuple[Updater, Objective]:
    cfg = config(path, strategy, *(x for x in extra if x != SFT))
    torch.manual_seed(0)
    updater = Updater.from_config(cfg, path, "cpu")
    if SFT in extra:
        return updater, SupervisedObjective(dft=False)
    return updater, RLObjective.from_config(cfg)


def prepared(updater: Updater, objective: Objective) -> Batch:
    """The fixed batch; for RL with algo.kl_coef the reference's log-probs added."""
    batch = rl_batch()
    if isinstance(objective, RLObjective) and objective.needs_reference:
        batch = with_reference(batch, updater, objective.temperature, kl_reward=None)[0]
    return batch


def update(updater: Updater, batch: Batch, step: int, objective: Objective) -> dict[str, float]:
    passes = SFT_PASSES if isinstance(objective, SupervisedObjective) else {}
    return updater.update(batch, step, objective, **passes)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two weight dicts of the same names."""
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def full_weights(updater: Updater) -> dict[str, torch.Tensor]:
    return {n: plain(p.detach()).clone() for n, p in updater.model.named_parameters()}


def push(updater: Updater) -> dict[str, Any]:
    """Consume the weight push as an engine does (copy each tensor, drop it) and watch what it
    holds: the most pushed tensors alive at once and the bytes of their storages (a view into a
    larger gathered buffer would show as more bytes than the tensor's own), beside the pushed
    total. Every rank runs it (the gathers are collectives); rank 0 gets the tensors."""
    seen: list[weakref.ref] = []
    copies: dict[str, torch.Tensor] = {}
    most_alive = most_bytes = largest = 0
    for name, tensor in updater.named_weights():
        seen.append(weakref.ref(tensor))
        alive = [t for t in (r() for r in seen) if t is not None]
        most_alive = max(most_alive, len(alive))
        most_bytes = max(most_bytes, sum(t.untyped_storage().nbytes() for t in alive))
        largest = max(largest, tensor.numel() * tensor.element_size())
        copies[name] = tensor.detach().clone()
        del alive, tensor
    total = sum(t.numel() * t.element_size() for t in copies.values())
    return {"pushed": copies, "most_alive": most_alive, "most_bytes": most_bytes, "largest": largest, "total": total}


def run(path: str, strategy: str, out: str, resume_from: str | None = None, *extra: str) -> None:
    """3 updates on the fixed batch; rank 0 writes {losses, grads (step 1), weights} to out/result.pt,
    every rank its shards to out/ckpt; with `resume_from`, a fresh learner loads that checkpoint
    and makes update 4 (rank 0 writes the loaded and the updated weights to out/resumed.pt)."""
    out_dir = Path(out)
    updater, objective = learner(path, strategy, *extra)
    grads: list[dict[str, torch.Tensor]] = []
    updater.optimizer.register_step_pre_hook(lambda *_: grads.append(
        {n: plain(p.grad).clone() for n, p in updater.model.named_parameters() if p.grad is not None})
        if not grads else None)
    batch = prepared(updater, objective)
    losses = [update(updater, batch, step, objective)["loss"] for step in range(1, STEPS + 1)]
    weights = full_weights(updater)
    pushed = push(updater)
    if group.is_main():
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"losses": losses, "grads": grads[0], "weights": weights, **pushed}, out_dir / "result.pt")
    updater.save_sharded(out_dir / "ckpt")
    if resume_from:
        resume(path, strategy, out, resume_from, *extra)


def resume(path: str, strategy: str, out: str, ckpt: str, *extra: str) -> None:
    """A fresh learner loads `ckpt` and makes update 4; rank 0 writes the loaded and the updated
    weights to out/resumed.pt."""
    again, objective = learner(path, strategy, *extra)
    again.load_sharded(Path(ckpt))
    loaded = full_weights(again)
    update(again, prepared(again, objective), STEPS + 1, objective)
    after = full_weights(again)  # a collective: every rank
    if group.is_main():
        torch.save({"loaded": loaded, "weights": after}, Path(out) / "resumed.pt")


def run_variants(path: str, out: str, resume_from: dict[str, str], variants: dict[str, list[str]]) -> None:
    """One rank of a spawned group: `run` for each named variant (strategy first, then overrides) in
    out/NAME, resuming from resume_from[NAME]."""
    group.init_from_env("gloo", torch.device("cpu"))
    torch.set_num_threads(1)
    for name, (strategy, *extra) in variants.items():
        run(path, strategy, f"{out}/{name}", resume_from[name], *extra)
