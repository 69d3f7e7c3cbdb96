"""The critic for PPO: a scalar-head model (a value per token) hosted by its own `Updater`,
trained on GAE returns with the clipped value objective (`ValueObjective`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from upslope.batch import Batch
from upslope.config import Config, LoraConfig, OptimConfig
from upslope.distributed import group
from upslope.errors import UpslopeError
from upslope.models import resolve_model
from upslope.scalar_head import scalar_loader, token_values
from upslope.train.learner.objectives import ValueObjective
from upslope.train.learner.updater import SHARDED_STATE, Updater

CRITIC_SHARDS = "critic"  # the critic's DCP shards, inside a sharded checkpoint's sharded/


def critic_optim(cfg: Config) -> OptimConfig:
    """The critic's optimiser: AdamW at critic.lr with torch's defaults (betas 0.9/0.999, weight
    decay 0.01), fp32 moments, constant lr, its gradient clipped at critic.grad_clip."""
    return OptimConfig(lr=cfg.critic.lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                       grad_clip=cfg.critic.grad_clip, state_dtype="float32",
                       max_nonfinite_steps=cfg.optim.max_nonfinite_steps)


class Critic:
    """PPO's value model: fp32 weights (bf16 autocast under train.precision=bfloat16), a
    zero-initialised head with a bias, one optimiser step per batch over token-budget
    micro-batches (train.micro_batch_tokens), each row forwarded whole."""

    def __init__(self, cfg: Config, model_path: str, device: torch.device):
        path = resolve_model(cfg.critic.model, option="critic.model") if cfg.critic.model else model_path
        train = cfg.train.model_copy(update={"share_prompt": False, "lean_activations": False,
                                             "grad_checkpointing": False, "updates_per_batch": 1,
                                             "epochs_per_batch": 1})
        self.updater = Updater(path, cfg.model.model_copy(update={"dtype": "float32"}), train, critic_optim(cfg),
                               LoraConfig(), device, loader=scalar_loader(pad_id=None, bias=True, dtype="float32"),
                               dist=cfg.dist)
        self.objective = ValueObjective(cfg.critic.value_clip)

    @classmethod
    def from_config(cls, cfg: Config, model_path: str, device: torch.device) -> "Critic":
        """The critic of a run's config (its critic section, precision, micro-batch budget, non-finite limit)."""
        return cls(cfg, model_path, device)

    @torch.no_grad()
    def values(self, batch: Batch) -> torch.Tensor:
        """[N, L] values of the batch's trained tokens (0 elsewhere), on the CPU."""
        u = self.updater
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for idx in u.micro_batches(batch):
            mb = batch.select(idx).to(u.device)
            with u.autocast():
                v = token_values(u.model, mb)
            out[torch.as_tensor(idx), : v.shape[1]] = v.cpu()
        return out

    def train_step(self, batch: Batch, step: int = 0) -> dict[str, float]:
        """One optimiser step of the value objective on the batch (its values and returns set)."""
        m = self.updater.update(batch, step, self.objective)
        return {"critic/loss": m["loss"], "critic/grad_norm": m["grad_norm"],
                "critic/nonfinite_skipped": m["learner/nonfinite_skipped"], "critic/clip_frac": m.get("clip_frac", 0.0)}

    def state(self) -> dict[str, Any]:
        """Weights, optimiser and schedule, for the run's checkpoint; across learner ranks the
        weights and optimiser state go into its DCP shards instead (`save_sharded`)."""
        weights = self.updater.model.state_dict() if group.world() == 1 else SHARDED_STATE
        return {"weights": weights, **self.updater.state()}

    def save_sharded(self, shards: Path) -> None:
        """Every rank: the critic's weights and optimiser state as DCP shards in `shards`/critic
        (`shards`: the checkpoint's sharded/ directory), loadable on any number of ranks."""
        self.updater.save_sharded(shards / CRITIC_SHARDS)

    def load(self, state: dict[str, Any], shards: Path | None = None) -> None:
        """Restore what `state` saved, the weights and optimiser state from `shards`/critic when the
        checkpoint was written across ranks (any number of ranks reads it); a one-process state
        loads into N ranks too. One error line for a critic state this critic cannot take."""
        sharded = shards is not None and (shards / CRITIC_SHARDS).is_dir()
        try:
            if sharded:
                self.updater.load_sharded(shards / CRITIC_SHARDS)  # type: ignore[operator]
            elif state["weights"] == SHARDED_STATE:
                raise KeyError("its DCP shards (sharded/critic) are missing")
            elif group.world() > 1:  # a one-process checkpoint: every rank reads it whole, keeps its shards
                self.updater.load_full(state["weights"], state["optimizer"])
                state = {**state, "optimizer": SHARDED_STATE}
            else:
                self.updater.model.load_state_dict(state["weights"])
            self.updater.load_state(state)
        except (KeyError, RuntimeError, ValueError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise UpslopeError(f"the checkpoint's critic state does not fit this critic ({reason}); it was written "
                               f"by another critic.model or an older upslope: start a new run") from None

