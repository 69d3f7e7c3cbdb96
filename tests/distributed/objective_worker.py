"""One learner rank of the sharded-trainer tests (imported by the spawned processes): the learner
of `upslope dpo`, `upslope rm`, `upslope distill` and PPO's critic, each on its own Updater and
objective as its trainer builds them, makes 3 updates of a fixed batch; rank 0 writes the
logged metrics and the weights. The frozen models (DPO's reference, the distillation teacher)
are loaded beside the policy, so across ranks they are sharded like it; rank 0 records how many
of their bytes each rank holds. The critic also writes a checkpoint and resumes another run's."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from batch_helpers import grouped_rl_batch
from shard_worker import STEPS, config, full_weights

from upslope.batch import Batch
from upslope.distributed import group
from upslope.registry import DISTILL_LOSSES, PREFERENCE_LOSSES
from upslope.train.learner.objectives import BradleyTerryObjective, DistillObjective, PreferenceObjective
from upslope.scalar_head import scalar_loader
from upslope.train.learner.updater import Updater
from upslope.train.methods.critic import Critic
from upslope.train.methods.pair_batch import pair_batch
from upslope.train.methods.teacher import Teacher

PAD = 2  # the SmolLM2 tokenizer's pad id is 2; any id the random replies avoid does


def pairs(n: int = 5) -> Batch:
    """`n` preference pairs: a shared prompt of 3-5 tokens, chosen and rejected replies of 2-6."""
    gen = torch.Generator().manual_seed(0)
    ids = lambda k: torch.randint(5, 400, (k,), generator=gen).tolist()  # noqa: E731
    prompts = [ids(3 + i % 3) for i in range(n)]
    return pair_batch(prompts, [ids(2 + i % 5) for i in range(n)], [ids(3 + (i + 2) % 4) for i in range(n)],
                      list(range(n)), PAD)


def held_bytes(model: Any) -> dict[str, int]:
    """The bytes of `model`'s parameters this rank holds (its shards) and the whole model's."""
    params = list(model.parameters())
    local = sum(p.to_local().nbytes if hasattr(p, "to_local") else p.nbytes for p in params)
    return {"local": local, "full": sum(p.numel() * p.element_size() for p in params)}


def updates(updater: Updater, batch: Batch, objective: Any, step: Callable[..., dict[str, float]] | None = None,
            first: int = 1) -> list[dict[str, float]]:
    """The metrics of `STEPS` updates of the batch (`step`: another update, e.g. the critic's train step)."""
    step = step or (lambda b, s: updater.update(b, s, objective))
    return [step(batch, s) for s in range(first, first + STEPS)]


def dpo(path: str, strategy: str, out: Path, teacher: str) -> dict[str, Any]:
    """`upslope dpo` (on-policy pairs): the sigmoid loss against the frozen reference's log-probs."""
    cfg = config(path, strategy)
    updater = Updater.from_config(cfg, path, "cpu")
    objective = PreferenceObjective(PREFERENCE_LOSSES.bind("sigmoid", {"beta": 0.5}))
    batch = pairs()
    batch.ref_logprobs = updater.logprobs(batch, temperature=1.0, reference=True)
    return {"metrics": updates(updater, batch, objective), "weights": full_weights(updater),
            "reference": held_bytes(updater.reference())}


def rm(path: str, strategy: str, out: Path, teacher: str) -> dict[str, Any]:
    """`upslope rm`: a scalar-head reward model, Bradley-Terry loss over the pairs."""
    cfg = config(path, strategy, "train.share_prompt=false")
    updater = Updater(path, cfg.model, cfg.train, cfg.optim, cfg.lora, "cpu", loader=scalar_loader(pad_id=PAD),
                      dist=cfg.dist)
    return {"metrics": updates(updater, pairs(), BradleyTerryObjective(margin=0.1)), "weights": full_weights(updater)}


def distill(path: str, strategy: str, out: Path, teacher: str) -> dict[str, Any]:
    """`upslope distill`: another model as the teacher (its top-4 per token), the sampled reverse KL."""
    cfg = config(path, strategy, f"distill.teacher={teacher}", "distill.top_k=4", "distill.teacher_temperature=1.5")
    updater = Updater.from_config(cfg, path, "cpu")
    from upslope.models import load_tokenizer

    scorer = Teacher(cfg.distill, cfg.model, path, load_tokenizer(path))
    batch = scorer.score(grouped_rl_batch([1.0, 0.5, 0.0], 3, seed=1, length_cycle=5), updater)
    loss = DISTILL_LOSSES.bind(cfg.distill.loss.name, cfg.distill.loss.options)
    objective = DistillObjective(loss, cfg.algo, cfg.train, temperature=1.0, max_new_tokens=8)
    return {"metrics": updates(updater, batch, objective), "weights": full_weights(updater),
            "teacher": held_bytes(scorer.model)}


CRITIC = ("algo.advantage.name=gae", "critic.lr=1e-3", "critic.value_clip=0.05")


def critic_batch(critic: Critic) -> Batch:
    """RL rows with returns in [-1, 1] and the critic's own values."""
    batch = grouped_rl_batch([1.0, 0.5, 0.0, -2.0], 3, seed=0, length_cycle=5)
    batch.returns = torch.linspace(-1, 1, batch.loss_mask.numel()).reshape(batch.loss_mask.shape) * batch.loss_mask
    batch.values = critic.values(batch)
    return batch


def critic(path: str, strategy: str, out: Path, teacher: str) -> dict[str, Any]:
    """PPO's critic: the clipped value loss on its own Updater; then a checkpoint of it (sharded/critic
    across ranks, its state dict in one process) that `critic_resumed` reads."""
    cfg = config(path, strategy, *CRITIC)
    value = Critic.from_config(cfg, path, torch.device("cpu"))
    batch = critic_batch(value)
    metrics = updates(value.updater, batch, None, step=value.train_step)
    weights = full_weights(value.updater)
    if group.world() > 1:
        value.save_sharded(out / "shards")
    return {"metrics": metrics, "weights": weights, "state": value.state()}  # state: what trainer.pt holds


def critic_resumed(path: str, strategy: str, checkpoint: Path) -> dict[str, Any]:
    """A fresh critic restored from `critic`'s checkpoint in `checkpoint` (written by 1 or 2 ranks), then
    one more update: the loaded and the updated weights."""
    cfg = config(path, strategy, *CRITIC)
    value = Critic.from_config(cfg, path, torch.device("cpu"))
    value.load(torch.load(checkpoint / "result.pt", weights_only=False)["state"], checkpoint / "shards")
    loaded = full_weights(value.updater)
    value.train_step(critic_batch(value), STEPS + 1)
    return {"loaded": loaded, "weights": full_weights(value.updater)}


CASES = {"dpo": dpo, "rm": rm, "distill": distill, "critic": critic}


def run(path: str, strategy: str, out: str, teacher: str, resume_from: str | None = None) -> None:
    """Every case in out/CASE (rank 0 writes result.pt), the critic resuming from resume_from/critic."""
    for name, case in CASES.items():
        where = Path(out) / name
        where.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        result = case(path, strategy, where, teacher)
        if group.is_main():
            torch.save(result, where / "result.pt")
        group.barrier()
    if resume_from:
        resumed = critic_resumed(path, strategy, Path(resume_from) / "critic")
        if group.is_main():
            torch.save(resumed, Path(out) / "critic" / "resumed.pt")


def run_ranks(path: str, out: str, teacher: str, resume_from: str, strategies: list[str]) -> None:
    """One rank of a spawned group: `run` for each strategy in out/STRATEGY (resuming from
    resume_from/STRATEGY), on the gloo group of the environment, one thread."""
    group.init_from_env("gloo", torch.device("cpu"))
    torch.set_num_threads(1)
    for strategy in strategies:
        run(path, strategy, f"{out}/{strategy}", teacher, f"{resume_from}/{strategy}")
