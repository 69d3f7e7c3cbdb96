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
from upslope.train.finite import NonFiniteGuard
from upslope.train.logprobs import HeadOutput, same_prompt_within_groups, token_scores
from upslope.train.memory import use_lean_activations
from upslope.train.optim import make_optimizer, make_scheduler

LossFn = Callable[[torch.Tensor, torch.Tensor, Batch, dict[str, float]], tuple[torch.Tensor, dict[str, float]]]


def zero_advantage_rows(batch: Batch) -> torch.Tensor:
    """bool [N]: rows whose advantage is 0 at every trained token (e.g. a GRPO group whose
    samples all got the same reward)."""
    assert batch.advantages is not None
    return ((batch.advantages != 0) & (batch.loss_mask > 0)).sum(dim=1) == 0


def default_device() -> torch.device:
    """Where the learner trains: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Learner:
    def __init__(self, cfg: Config, model_path: str, device: str | torch.device | None = None):
        self.cfg = cfg
        self.device = torch.device(device) if device is not None else default_device()
        self.model = load_model(model_path, cfg.model.dtype, cfg.model.trust_remote_code).to(self.device)
        self.model.config.use_cache = False  # the shared-prompt forward passes its own cache
        if cfg.train.lean_activations:
            use_lean_activations(self.model)
        if cfg.lora.enabled:  # only the adapter trains; the base weights stay frozen
            self.model = lora.wrap(self.model, cfg.lora)
        self.model.train()
        self.model_path = model_path
        self.ref = None
        if cfg.algo.kl_coef > 0:  # no reference model at all unless KL is used
            self.load_reference()
            self.kl_fn = KL_ESTIMATORS.bind(cfg.algo.kl_estimator, where="algo.kl_estimator")
        a = cfg.algo
        self.kl_ctl = (AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target
                       else FixedKLController(a.kl_coef))
        self.policy_loss = POLICY_LOSSES.bind(cfg.algo.policy_loss.name, cfg.algo.policy_loss.options,
                                              where="algo.policy_loss.options")
        self.optimizer = make_optimizer(self.model.parameters(), cfg.optim, seed=cfg.train.seed)
        total = cfg.train.steps * cfg.train.updates_per_batch * cfg.train.epochs_per_batch
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, total)
        self.nonfinite = NonFiniteGuard(cfg.optim.max_nonfinite_steps)
        self.temperature = cfg.rollout.temperature or 1.0

    def load_reference(self) -> None:
        """The frozen reference (the initial model), once, for methods that need one: with LoRA the
        policy with its adapter switched off (no second copy in memory), else a fresh copy."""
        if self.ref is not None:
            return
        if self.cfg.lora.enabled:
            self.ref = lora.AdapterOff(self.model)
        else:
            self.ref = load_model(self.model_path, self.cfg.model.dtype).to(self.device).eval()
            self.ref.requires_grad_(False)

    # ------------------------------------------------------------------ forward passes

    def autocast(self) -> contextlib.AbstractContextManager:
        enabled = self.cfg.train.precision == "bfloat16" and self.cfg.model.dtype == "float32"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    @property
    def share_prompt(self) -> bool:
        """Forward each group's prompt once (KV cache shared by its completions)?"""
        return self.cfg.train.share_prompt

    def micro_batches(self, batch: Batch, whole_groups: bool = False) -> list[list[int]]:
        """Row indices of each micro-batch; with `whole_groups` no group is ever split (for
        losses that compare a group's rows, e.g. a preference pair's chosen and rejected)."""
        budget = self.cfg.train.micro_batch_tokens
        if self.share_prompt:
            return group_micro_batch_indices(batch.prompt_lens, batch.seq_lens, batch.group_ids, budget,
                                             split_oversized=not whole_groups)
        if whole_groups:
            return group_micro_batch_indices(torch.zeros_like(batch.prompt_lens), batch.seq_lens, batch.group_ids,
                                             budget, split_oversized=False)
        return micro_batch_indices(batch.seq_lens, budget)

    def forwarded_tokens(self, batch: Batch) -> int:
        """Tokens one forward pass over the batch processes (each group's prompt once when shared)."""
        if not self.share_prompt:
            return int(batch.seq_lens.sum())
        completions = int((batch.seq_lens - batch.prompt_lens).sum())
        prompts = sum(int(batch.prompt_lens[batch.group_ids == g][0]) for g in batch.group_ids.unique())
        return completions + prompts

    def _scores(self, model: Any, mb: Batch, *, temperature: float | None = None,
                gather_ids: torch.Tensor | None = None, top_k: int = 0, top_k_vocab: int | None = None) -> HeadOutput:
        """One micro-batch through `model` (temperature default: the sampling temperature)."""
        mb = mb.to(self.device)
        with self.autocast():
            shared = None
            if self.share_prompt and same_prompt_within_groups(mb.input_ids, mb.prompt_lens, mb.group_ids):
                shared = (mb.prompt_lens, mb.seq_lens, mb.group_ids)
            return token_scores(model, mb.input_ids, mb.attention_mask, mb.loss_mask, shared=shared,
                                chunk_rows=self.cfg.train.logprob_chunk,
                                temperature=self.temperature if temperature is None else temperature,
                                entropy_grad=bool(self.cfg.algo.entropy_coef) and torch.is_grad_enabled(),
                                gather_ids=None if gather_ids is None else gather_ids.to(self.device),
                                top_k=top_k, top_k_vocab=top_k_vocab,
                                checkpoint_layers=self.cfg.train.grad_checkpointing)

    @torch.no_grad()
    def score(self, batch: Batch, model: Any = None, *, temperature: float | None = None, top_k: int = 0,
              top_k_vocab: int | None = None) -> HeadOutput:
        """No-grad forward of the batch's trained tokens in token-budget micro-batches, on the CPU:
        [N, L] log-probs and entropies, and with `top_k` the model's own top-k ids and log-probs
        [N, L, K]. `model` defaults to the policy (a frozen reference or a teacher otherwise)."""
        model = self.model if model is None else model
        n, length = batch.input_ids.shape
        lp, ent = torch.zeros(n, length), torch.zeros(n, length)
        topk_lp = torch.zeros(n, length, top_k) if top_k else None
        topk_ids = torch.zeros(n, length, top_k, dtype=torch.long) if top_k else None
        self.model.eval()  # scoring: no dropout (LoRA's included)
        try:
            for idx in self.micro_batches(batch):
                out = self._scores(model, batch.select(idx), temperature=temperature, top_k=top_k,
                                   top_k_vocab=top_k_vocab)
                rows, width = torch.as_tensor(idx), out.logprobs.shape[1]
                lp[rows, :width], ent[rows, :width] = out.logprobs.cpu(), out.entropy.cpu()
                if topk_lp is not None and topk_ids is not None:
                    topk_lp[rows, :width], topk_ids[rows, :width] = out.topk_logprobs.cpu(), out.topk_ids.cpu()
        finally:
            self.model.train()
        return HeadOutput(lp, ent, topk_logprobs=topk_lp, topk_ids=topk_ids)

    def logprobs(self, batch: Batch, reference: bool = False) -> torch.Tensor:
        """[N, L] log-probs of the batch's trained tokens under the policy (or reference)."""
        return self.score(batch, self.ref if reference else self.model).logprobs

    # ------------------------------------------------------------------ update

    def mini_batches(self, batch: Batch, step: int, updates: int | None = None,
                     epochs: int | None = None) -> Iterator[Batch]:
        """The batch split into `updates` mini-batches (default train.updates_per_batch), for each
        of `epochs` passes (default train.epochs_per_batch); whole groups stay together."""
        t = self.cfg.train
        updates = updates or t.updates_per_batch
        gen = torch.Generator().manual_seed(t.seed * 1_000_003 + step)
        for _ in range(epochs or t.epochs_per_batch):
            groups = batch.group_ids.unique()
            groups = groups[torch.randperm(len(groups), generator=gen)] if updates > 1 else groups
            for part in torch.tensor_split(groups, min(updates, len(groups))):
                rows = torch.nonzero(torch.isin(batch.group_ids, part)).flatten()
                yield batch.select(rows)

    def optimize(self, batch: Batch, step: int, loss_fn: LossFn, updates: int | None = None,
                 epochs: int | None = None, gather: Callable[[Batch], torch.Tensor] | None = None,
                 whole_groups: bool = False, skip: Callable[[Batch], torch.Tensor] | None = None) -> dict[str, float]:
        """The update every trainer shares: `updates_per_batch` mini-batches x `epochs_per_batch`
        optimiser steps (or `updates` x `epochs` when given), each accumulated over token-budget
        micro-batches. `loss_fn(lp, ent, mb, norms)` returns the micro-batch's share of the
        mini-batch loss (normalised by `norms`, the mini-batch's token and sequence counts) and
        per-token-mean metrics. With `gather` (micro-batch -> token ids [n, L, K]) the policy's
        log-probs at those ids are computed in the same forward, with gradient, and passed as a
        fifth argument: loss_fn(..., gathered). With `whole_groups` every micro-batch holds whole
        groups, whatever train.share_prompt. With `skip` (mini-batch -> bool [N]) the rows it marks,
        whose loss and gradient are exactly 0, are not forwarded; the loss's normalisers still
        count them, so the update equals the one over every row."""
        sums: dict[str, float] = defaultdict(float)
        for mini in self.mini_batches(batch, step, updates, epochs):
            norms = loss_normalizers(mini.loss_mask)
            if skip is not None:
                keep = ~skip(mini)
                sums["rows_skipped"] += float((~keep).sum())
                mini = mini.select(torch.nonzero(keep).flatten())
            sums["rows"] += float(mini.size)
            for idx in self.micro_batches(mini, whole_groups):
                mb = mini.select(idx).to(self.device)
                sums["forwarded"] += float(self.forwarded_tokens(mb))
                out = self._scores(self.model, mb, gather_ids=gather(mb) if gather is not None else None)
                lp, ent = out.logprobs, out.entropy
                loss, metrics = (loss_fn(lp, ent, mb, norms) if gather is None
                                 else loss_fn(lp, ent, mb, norms, out.gathered))
                loss.backward()
                ntok = float(mb.loss_mask.sum())
                sums["tokens"] += ntok
                sums["loss"] += float(loss.detach())
                sums["entropy"] += float((ent * mb.loss_mask).sum())
                for k, v in metrics.items():
                    sums[k] += float(v) * ntok
            if mini.size == 0:  # every row skipped: the optimiser steps on zero gradients, as it would have
                for p in self.model.parameters():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
            clip = self.cfg.optim.grad_clip
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
            if self.nonfinite.skip(norm, self.optimizer):  # NaN/inf gradient: no update, counted
                continue
            sums["grad_norm"] += float(norm)
            sums["updates"] += 1
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
        tokens = sums.pop("tokens", 0.0)
        updates = max(sums.pop("updates", 0.0), 1.0)
        skipped, rows = sums.pop("rows_skipped", 0.0), sums.pop("rows", 0.0)
        out = {"loss": sums.pop("loss", 0.0) / updates, "grad_norm": sums.pop("grad_norm", 0.0) / updates,
               "lr": self.scheduler.get_last_lr()[0], "learner/tokens": sums.pop("forwarded", 0.0),
               "learner/nonfinite_skipped": self.nonfinite.take()}
        if skip is not None:
            out["learner/rows_skipped_frac"] = skipped / max(skipped + rows, 1.0)
        if tokens:  # per-token means over the forwarded rows (none when every row was skipped)
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
        skip = zero_advantage_rows if self.skips_zero_advantage else None

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

        out = self.optimize(batch, step, rl_loss, skip=skip)
        if batch.old_logprobs is not None:
            m = batch.loss_mask
            out["mismatch"] = float(((batch.old_logprobs - batch.sampler_logprobs).abs() * m).sum() / m.sum().clamp(min=1))
        return out

    @property
    def skips_zero_advantage(self) -> bool:
        """May RL rows with zero advantage skip the update? Only when nothing but the policy loss
        (zero there, with zero gradient) acts on them: no KL in the loss, no entropy bonus."""
        a = self.cfg.algo
        return (self.cfg.train.skip_zero_advantage and not (self.ref is not None and a.kl_in == "loss")
                and not a.entropy_coef
                and bool(POLICY_LOSSES.get(a.policy_loss.name).attrs.get("zero_at_zero_advantage")))

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
