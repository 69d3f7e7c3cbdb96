"""The learner: policy (and optional frozen reference), optimiser, and one update over a
rollout batch, in micro-batches bounded by a token budget."""
from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch

from upslope import lora
from upslope.algos.aggregate import aggregate, loss_normalizers
from upslope.algos.correction import importance_correction
from upslope.algos.kl import AdaptiveKLController, FixedKLController
from upslope.batch import Batch, group_micro_batch_indices, micro_batch_indices
from upslope.config import Config
from upslope.models import load_model
from upslope.registry import KL_ESTIMATORS, POLICY_LOSSES
from upslope.train.logprobs import same_prompt_within_groups, token_logprobs, token_logprobs_shared_prompt
from upslope.train.optim import make_optimizer, make_scheduler

LossFn = Callable[[torch.Tensor, torch.Tensor, Batch, dict[str, float]], tuple[torch.Tensor, dict[str, float]]]


def default_device() -> torch.device:
    """Where the learner trains: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Learner:
    def __init__(self, cfg: Config, model_path: str, device: str | torch.device | None = None):
        self.cfg = cfg
        self.device = torch.device(device) if device is not None else default_device()
        self.model = load_model(model_path, cfg.model.dtype, cfg.model.trust_remote_code).to(self.device)
        self.model.config.use_cache = False  # the shared-prompt forward passes its own cache
        if cfg.train.grad_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora.enabled:  # only the adapter trains; the base weights stay frozen
            self.model = lora.wrap(self.model, cfg.lora)
        self.model.train()
        self.ref = None
        if cfg.algo.kl_coef > 0:  # no reference model at all unless KL is used
            self.ref = self.reference_model(model_path)
            self.kl_fn = KL_ESTIMATORS.bind(cfg.algo.kl_estimator, where="algo.kl_estimator")
        a = cfg.algo
        self.kl_ctl = (AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target
                       else FixedKLController(a.kl_coef))
        self.policy_loss = POLICY_LOSSES.bind(cfg.algo.policy_loss.name, cfg.algo.policy_loss.options,
                                              where="algo.policy_loss.options")
        self.optimizer = make_optimizer(self.model.parameters(), cfg.optim)
        total = cfg.train.steps * cfg.train.updates_per_batch * cfg.train.epochs_per_batch
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, total)
        self.temperature = cfg.rollout.temperature or 1.0

    def reference_model(self, model_path: str) -> Any:
        """The frozen reference: with LoRA the policy with its adapter switched off (the base
        model, no second copy in memory); otherwise a fresh copy of the base model."""
        if self.cfg.lora.enabled:
            return lora.AdapterOff(self.model)
        ref = load_model(model_path, self.cfg.model.dtype).to(self.device).eval()
        return ref.requires_grad_(False)

    # ------------------------------------------------------------------ forward passes

    def autocast(self) -> contextlib.AbstractContextManager:
        enabled = self.cfg.train.precision == "bfloat16" and self.cfg.model.dtype == "float32"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    @property
    def share_prompt(self) -> bool:
        """Forward each group's prompt once (KV cache shared by its completions)? Not with
        gradient checkpointing, which disables HF's cache."""
        return self.cfg.train.share_prompt and not self.cfg.train.grad_checkpointing

    def micro_batches(self, batch: Batch) -> list[list[int]]:
        budget = self.cfg.train.micro_batch_tokens
        if self.share_prompt:
            return group_micro_batch_indices(batch.prompt_lens, batch.seq_lens, batch.group_ids, budget)
        return micro_batch_indices(batch.seq_lens, budget)

    def forwarded_tokens(self, batch: Batch) -> int:
        """Tokens one forward pass over the batch processes (each group's prompt once when shared)."""
        if not self.share_prompt:
            return int(batch.seq_lens.sum())
        completions = int((batch.seq_lens - batch.prompt_lens).sum())
        prompts = sum(int(batch.prompt_lens[batch.group_ids == g][0]) for g in batch.group_ids.unique())
        return completions + prompts

    def _forward(self, model: Any, mb: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        mb = mb.to(self.device)
        kw = {"chunk_rows": self.cfg.train.logprob_chunk, "temperature": self.temperature,
              "entropy_grad": bool(self.cfg.algo.entropy_coef) and torch.is_grad_enabled()}
        with self.autocast():
            if self.share_prompt and same_prompt_within_groups(mb.input_ids, mb.prompt_lens, mb.group_ids):
                return token_logprobs_shared_prompt(model, mb.input_ids, mb.attention_mask, mb.loss_mask,
                                                    mb.prompt_lens, mb.seq_lens, mb.group_ids, **kw)
            return token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, **kw)

    @torch.no_grad()
    def logprobs(self, batch: Batch, reference: bool = False) -> torch.Tensor:
        """[N, L] log-probs of the batch's trained tokens under the policy (or reference)."""
        model = self.ref if reference else self.model
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        self.model.eval()  # scoring: no dropout (LoRA's included)
        try:
            for idx in self.micro_batches(batch):
                mb = batch.select(idx)
                lp, _ = self._forward(model, mb)
                out[torch.as_tensor(idx), : lp.shape[1]] = lp.cpu()
        finally:
            self.model.train()
        return out

    # ------------------------------------------------------------------ update

    def mini_batches(self, batch: Batch, step: int) -> Iterator[Batch]:
        """The batch split into `updates_per_batch` mini-batches, for each epoch; whole groups
        stay together when the split allows."""
        t = self.cfg.train
        gen = torch.Generator().manual_seed(t.seed * 1_000_003 + step)
        for _ in range(t.epochs_per_batch):
            groups = batch.group_ids.unique()
            groups = groups[torch.randperm(len(groups), generator=gen)] if t.updates_per_batch > 1 else groups
            for part in torch.tensor_split(groups, min(t.updates_per_batch, len(groups))):
                rows = torch.nonzero(torch.isin(batch.group_ids, part)).flatten()
                yield batch.select(rows)

    def optimize(self, batch: Batch, step: int, loss_fn: LossFn) -> dict[str, float]:
        """The update every trainer shares: `updates_per_batch` mini-batches x `epochs_per_batch`
        optimiser steps, each accumulated over token-budget micro-batches. `loss_fn(lp, ent, mb,
        norms)` returns the micro-batch's share of the mini-batch loss (normalised by `norms`,
        the mini-batch's token and sequence counts) and per-token-mean metrics."""
        sums: dict[str, float] = defaultdict(float)
        for mini in self.mini_batches(batch, step):
            norms = loss_normalizers(mini.loss_mask)
            for idx in self.micro_batches(mini):
                mb = mini.select(idx).to(self.device)
                lp, ent = self._forward(self.model, mb)
                loss, metrics = loss_fn(lp, ent, mb, norms)
                loss.backward()
                ntok = float(mb.loss_mask.sum())
                sums["tokens"] += ntok
                sums["loss"] += float(loss.detach())
                sums["entropy"] += float((ent * mb.loss_mask).sum())
                for k, v in metrics.items():
                    sums[k] += float(v) * ntok
            clip = self.cfg.optim.grad_clip
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
            sums["grad_norm"] += float(norm)
            sums["updates"] += 1
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
        tokens = max(sums.pop("tokens", 0.0), 1.0)
        updates = max(sums.pop("updates", 0.0), 1.0)
        out = {"loss": sums.pop("loss", 0.0) / updates, "grad_norm": sums.pop("grad_norm", 0.0) / updates,
               "lr": self.scheduler.get_last_lr()[0]}
        out.update({k: v / tokens for k, v in sums.items()})
        return out

    def train_step(self, batch: Batch, step: int) -> dict[str, float]:
        """Update the policy on one rollout batch (advantages set). Old log-probs cost a
        forward pass only when there is more than one optimiser step per batch."""
        t, algo = self.cfg.train, self.cfg.algo
        one_pass = t.updates_per_batch * t.epochs_per_batch == 1
        if not one_pass and batch.old_logprobs is None:
            batch.old_logprobs = self.logprobs(batch)
        constant = algo.loss_agg_constant or float(self.cfg.rollout.max_new_tokens)
        kl_in_loss = self.ref is not None and algo.kl_in == "loss"

        def rl_loss(lp: torch.Tensor, ent: torch.Tensor, mb: Batch,
                    norms: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
            mask = mb.loss_mask
            old = mb.old_logprobs if mb.old_logprobs is not None else lp.detach()
            per_token, metrics = self.policy_loss(lp, old, mb.advantages, mask)
            metrics = dict(metrics)
            if algo.correction is not None:
                c = algo.correction
                weights, _, cm = importance_correction(old, mb.sampler_logprobs, mask, level=c.level, cap=c.cap,
                                                       mask_low=c.mask_low, mask_high=c.mask_high)
                per_token = per_token * weights  # masked tokens have weight 0
                metrics.update({"tis/capped_frac": cm["capped_frac"], "tis/masked_frac": cm["masked_frac"]})
            ntok = max(float(mask.sum()), 1.0)
            if kl_in_loss:
                kl = self.kl_fn(lp, mb.ref_logprobs)
                per_token = per_token + self.kl_ctl.value * kl
                metrics["kl"] = float((kl.detach() * mask).sum()) / ntok
            if algo.entropy_coef:
                per_token = per_token - algo.entropy_coef * ent
            if one_pass:  # this forward is the policy that was sampled
                metrics["mismatch"] = float(((lp.detach() - mb.sampler_logprobs).abs() * mask).sum()) / ntok
            loss = aggregate(per_token, mask, algo.loss_agg, num_tokens=norms["num_tokens"],
                             num_seqs=norms["num_seqs"], constant=constant)
            return loss, metrics

        out = self.optimize(batch, step, rl_loss)
        if batch.old_logprobs is not None:
            m = batch.loss_mask
            out["mismatch"] = float(((batch.old_logprobs - batch.sampler_logprobs).abs() * m).sum() / m.sum().clamp(min=1))
        return out

    def update_kl_coef(self, kl: float, samples: int) -> float:
        """Adaptive KL: move beta toward the target after a step; fixed: unchanged."""
        return self.kl_ctl.update(kl, samples)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's parameters by HF name, for pushing into the rollout engine. With LoRA only
        the blocks the adapter changes, merged (the engine keeps the frozen rest since its start)."""
        if self.cfg.lora.enabled:
            yield from lora.merged_weights(self.model)
            return
        for name, p in self.model.named_parameters():
            yield name, p.detach()
