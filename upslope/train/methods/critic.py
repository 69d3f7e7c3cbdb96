"""The critic for PPO: a transformer body with a scalar value head, trained on GAE returns
with a clipped value loss and its own optimiser."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from upslope.algos.aggregate import aggregate, loss_normalizers
from upslope.batch import Batch, micro_batch_indices
from upslope.config import Config, CriticConfig
from upslope.models import resolve_model
from upslope.train.learner.finite import NonFiniteGuard


class Critic(torch.nn.Module):
    """Value model with its own optimiser: the value objective of PPO."""

    def __init__(self, cfg: CriticConfig, model_path: str, device: torch.device, *, precision: str,
                 micro_batch_tokens: int, trust_remote_code: bool = False, max_nonfinite_steps: int = 3):
        super().__init__()
        from transformers import AutoModel

        self.cfg, self.precision, self.micro_batch_tokens = cfg, precision, micro_batch_tokens
        path = resolve_model(cfg.model, option="critic.model") if cfg.model else model_path
        self.body = AutoModel.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
        self.head = torch.nn.Linear(self.body.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.to(device)
        self.device = device
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=cfg.lr, foreach=True)
        self.nonfinite = NonFiniteGuard(max_nonfinite_steps)

    @classmethod
    def from_config(cls, cfg: Config, model_path: str, device: torch.device) -> "Critic":
        """The critic of a run's config (its critic section, precision, micro-batch budget, non-finite limit)."""
        return cls(cfg.critic, model_path, device, precision=cfg.train.precision,
                   micro_batch_tokens=cfg.train.micro_batch_tokens, trust_remote_code=cfg.model.trust_remote_code,
                   max_nonfinite_steps=cfg.optim.max_nonfinite_steps)

    def forward(self, mb: Batch) -> torch.Tensor:
        """[n, L] values aligned to tokens: values[:, t] = V(state choosing token t)."""
        enabled = self.precision == "bfloat16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled):
            hidden = self.body(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long()).last_hidden_state
            v = self.head(hidden).squeeze(-1).float()
        return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], 1) * mb.loss_mask

    @torch.no_grad()
    def values(self, batch: Batch) -> torch.Tensor:
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for idx in micro_batch_indices(batch.seq_lens, self.micro_batch_tokens):
            v = self(batch.select(idx).to(self.device))
            out[torch.as_tensor(idx), : v.shape[1]] = v.cpu()
        return out

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimiser step on 0.5 * max((V - R)^2, (V_clipped - R)^2), token mean."""
        assert batch.returns is not None and batch.values is not None
        norms = loss_normalizers(batch.loss_mask)
        clip = self.cfg.value_clip
        total, clipped = 0.0, 0.0
        for idx in micro_batch_indices(batch.seq_lens, self.micro_batch_tokens):
            mb = batch.select(idx).to(self.device)
            v = self(mb)
            err = (v - mb.returns) ** 2
            if clip is not None:
                v_clip = mb.values + (v - mb.values).clamp(-clip, clip)
                err_clip = (v_clip - mb.returns) ** 2
                clipped += float(((err_clip > err).float() * mb.loss_mask).sum())
                err = torch.maximum(err, err_clip)
            loss = aggregate(0.5 * err, mb.loss_mask, "token_mean", **norms)
            loss.backward()
            total += float(loss.detach())
        gc = self.cfg.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.parameters(), gc if gc > 0 else float("inf"))
        if not self.nonfinite.skip(norm, self.optimizer):  # NaN/inf gradient: no update, counted
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"critic/loss": total, "critic/grad_norm": float(norm),
                "critic/nonfinite_skipped": self.nonfinite.take(),
                "critic/clip_frac": clipped / max(norms["num_tokens"], 1.0)}

    def state(self) -> dict[str, Any]:
        return {"weights": self.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])


def save_critic(critic: Critic, directory: Path) -> None:
    torch.save(critic.state(), directory / "critic.pt")
