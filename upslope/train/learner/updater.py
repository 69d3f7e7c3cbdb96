"""The generic updater: the policy model, its optimiser and schedule, precision, token-budget
micro-batching, checkpoint state and weight export. What is optimised comes from an
`Objective` (RL, SFT, DPO, distillation) that the trainer passes to `Updater.update`: the updater
runs the forward the objective declares and hands its outputs to the objective's loss, so it knows
no method, and the objective never calls back."""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from upslope import lora
from upslope.algos.aggregate import loss_normalizers
from upslope.batch import Batch, group_micro_batch_indices, micro_batch_indices
from upslope.config import Config, DistConfig, LoraConfig, ModelConfig, OptimConfig, TrainConfig
from upslope.distributed import group, shard
from upslope.distributed.balance import assign_by_tokens
from upslope.models import load_model
from upslope.scalar_head import token_values
from upslope.train.learner.finite import NonFiniteGuard
from upslope.train.learner.logprobs import HeadOutput, Truncation, same_prompt_within_groups, token_scores
from upslope.train.learner import mixers
from upslope.train.learner.memory import return_large_frees, use_lean_activations
from upslope.train.learner.optim import make_optimizer, make_scheduler, moments_as

if TYPE_CHECKING:
    from upslope.train.learner.objectives import Forward, ModelOutputs, Objective


SHARDED_STATE = "sharded"  # trainer state's optimizer entry when the state went into the DCP shards
# (path, model config, empty) -> the trained module; `empty`: its architecture with the parameters on
# the meta device (a learner rank other than 0, which receives its weights from rank 0)
ModelLoader = Callable[[str, ModelConfig, bool], Any]


def causal_lm(path: str, model: ModelConfig, empty: bool = False) -> Any:
    """The default trained model: a causal LM (the policy), with fused attention on a GPU."""
    from upslope.hardware import learner_device
    from upslope.models import attention_for

    return load_model(path, model.dtype, model.trust_remote_code, attention_for(learner_device()), empty=empty)


def reads_weights() -> bool:
    """Does this process read model weights from disk? One process or rank 0; the other learner
    ranks build empty models and receive their weights (shards) from rank 0."""
    return group.world() == 1 or group.is_main()


def default_device() -> torch.device:
    """Where the learner trains: the GPU when there is one."""
    from upslope.hardware import learner_device

    return torch.device(learner_device())


@dataclass
class Tally:
    """What an update counts: over the whole update (`sums`) and over this rank's micro-batches
    (`mine`, summed across ranks at the end)."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    mine: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class Updater:
    """Model + optimiser + schedule, and the one update loop every objective shares. The model
    is the policy (a causal LM) unless `loader` builds another (e.g. a scalar-head model for a
    critic or a reward model, see `upslope.scalar_head`)."""

    def __init__(self, model_path: str, model: ModelConfig, train: TrainConfig, optim: OptimConfig,
                 lora_cfg: LoraConfig, device: str | torch.device | None = None, loader: ModelLoader = causal_lm,
                 dist: DistConfig | None = None):
        self.model_cfg, self.train_cfg, self.optim_cfg, self.lora_cfg = model, train, optim, lora_cfg
        self.device = torch.device(device) if device is not None else default_device()
        self.dist_cfg = dist or DistConfig()
        shard.check_combination(self.dist_cfg, optim, model, self.device)
        if group.world() > 1 and self.device.type == "cpu":  # transient buffers must not stay resident
            return_large_frees()
        self.model = loader(model_path, model, not reads_weights())
        self.model.config.use_cache = False  # the shared-prompt forward passes its own cache
        if train.lean_activations:
            use_lean_activations(self.model)
        if lora_cfg.enabled:  # only the adapter trains; the base weights stay frozen
            self.model = lora.wrap(self.model, lora_cfg)
        self.model = self.place(self.model)
        self.model.train()
        self.model_path = model_path
        self._reference: Any = None
        self.optimizer = make_optimizer(self.model.parameters(), optim, seed=train.seed)
        total = train.steps * train.updates_per_batch * train.epochs_per_batch
        self.scheduler = make_scheduler(self.optimizer, optim, total)
        self.nonfinite = NonFiniteGuard(optim.max_nonfinite_steps)

    @classmethod
    def from_config(cls, cfg: Config, model_path: str, device: str | torch.device | None = None,
                    loader: ModelLoader = causal_lm) -> "Updater":
        """The updater for a run's config (only its model, train, optim, lora and dist sections are read)."""
        return cls(model_path, cfg.model, cfg.train, cfg.optim, cfg.lora, device, loader, cfg.dist)

    def place(self, model: Any) -> Any:
        """`model` where this learner computes: on its device in one process; across ranks DDP
        (whole on every rank) or FSDP2-sharded, filled from rank 0's weights (`shard.shard_model`)."""
        if group.world() == 1:
            return model.to(self.device)
        if reads_weights():
            model = model.to(self.device)
        model = shard.shard_model(model, self.dist_cfg, self.train_cfg, self.device)
        if shard.is_sharded(model):
            shard.register_entry(model, token_scores)
        return model

    def frozen(self, path: str) -> Any:
        """A frozen causal LM from `path` beside the policy (the KL reference, a distillation
        teacher), in eval mode and placed like the policy: across ranks read by rank 0 alone and
        sharded the same way (under FSDP each rank holds its shards of it, not a whole copy)."""
        m = self.model_cfg
        model = load_model(path, m.dtype, m.trust_remote_code, empty=not reads_weights())
        model.requires_grad_(False)
        model.config.use_cache = False
        return self.place(model).eval()

    def reference(self) -> Any:
        """The frozen reference (the initial model), loaded once on first use: with LoRA the
        policy with its adapter switched off (no second copy in memory), else a fresh copy."""
        if self._reference is None:
            self._reference = lora.AdapterOff(self.model) if self.lora_cfg.enabled else self.frozen(self.model_path)
        return self._reference

    @property
    def vocab_size(self) -> int:
        """Rows of the policy's output head (padded heads may exceed the tokenizer's vocabulary)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    # ------------------------------------------------------------------ forward passes

    def autocast(self) -> contextlib.AbstractContextManager:
        enabled = self.train_cfg.precision == "bfloat16" and self.model_cfg.dtype == "float32"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    @property
    def share_prompt(self) -> bool:
        """Forward each group's prompt once (KV cache shared by its completions)? Not for a model with
        recurrent layers, whose prompt state is no KV cache (`mixers`)."""
        return self.train_cfg.share_prompt and not mixers.sets_aside(self.model, "train.share_prompt")

    def micro_batches(self, batch: Batch, whole_groups: bool = False) -> list[list[int]]:
        """Row indices of each micro-batch; with `whole_groups` no group is ever split (for
        losses that compare a group's rows, e.g. a preference pair's chosen and rejected)."""
        budget, packed = self.train_cfg.micro_batch_tokens, self.train_cfg.packing is True
        if self.share_prompt:
            return group_micro_batch_indices(batch.prompt_lens, batch.seq_lens, batch.group_ids, budget,
                                             split_oversized=not whole_groups, packed=packed)
        if whole_groups:
            return group_micro_batch_indices(torch.zeros_like(batch.prompt_lens), batch.seq_lens, batch.group_ids,
                                             budget, split_oversized=False, packed=packed)
        return micro_batch_indices(batch.seq_lens, budget, packed=packed)

    def rank_micro_batches(self, mini: Batch, whole_groups: bool = False) -> list[tuple[list[int], float]]:
        """This rank's micro-batches of a mini-batch with the factor on each one's loss: all of them
        (factor 1) in one process; across ranks a share balanced by forwarded tokens, and under
        FSDP padded with zero-weighted repeats so that every rank runs as many forwards."""
        parts = self.micro_batches(mini, whole_groups)
        world = group.world()
        if world == 1:
            return [(idx, 1.0) for idx in parts]
        shares = assign_by_tokens([self.forwarded_tokens(mini.select(idx)) for idx in parts], world)
        scale = shard.loss_scale(self.model)
        mine = [(parts[i], scale) for i in shares[group.rank()]]
        if shard.is_sharded(self.model) and parts:
            mine += [(parts[0], 0.0)] * (max(map(len, shares)) - len(mine))
        return mine

    def forwarded_tokens(self, batch: Batch) -> int:
        """Tokens one forward pass over the batch processes (each group's prompt once when shared)."""
        if not self.share_prompt:
            return int(batch.seq_lens.sum())
        completions = int((batch.seq_lens - batch.prompt_lens).sum())
        prompts = sum(int(batch.prompt_lens[batch.group_ids == g][0]) for g in batch.group_ids.unique())
        return completions + prompts

    def padded_slots(self, batch: Batch) -> int:
        """Token slots a padded forward of the batch occupies: [rows, longest row], or with shared prompts
        [groups, longest prompt] plus [rows, longest completion]."""
        if not self.share_prompt:
            return batch.size * int(batch.seq_lens.max())
        groups = batch.group_ids.unique().numel()
        return groups * int(batch.prompt_lens.max()) + batch.size * int((batch.seq_lens - batch.prompt_lens).max())

    def packs(self, mb: Batch, router_aux: bool = False) -> bool:
        """Run this micro-batch packed? train.packing true: always; auto: when padding would fill at least a
        quarter of the padded forward's slots (below that, packing saves little) and no MoE routing is
        replayed or its loss taken (those run padded); false: never."""
        mode = self.train_cfg.packing
        if mode != "auto":
            return bool(mode)
        if router_aux or mb.routed_experts is not None:
            return False
        return 4 * self.forwarded_tokens(mb) <= 3 * self.padded_slots(mb)

    def forward(self, model: Any, mb: Batch, *, temperature: float, entropy_grad: bool = False,
                gather_ids: torch.Tensor | None = None, top_k: int = 0, top_k_vocab: int | None = None,
                truncation: Truncation = Truncation(), router_aux: bool = False) -> HeadOutput:
        """One micro-batch through `model`: per-token log-probs and entropies at `temperature` (and the
        sampler's `truncation`); with `router_aux` also the MoE routers' load-balancing loss. The policy
        routes each token through the experts the sampler recorded for it when the batch carries them
        (algo.routing_replay); a frozen reference or a teacher routes by its own routers."""
        mb = mb.to(self.device)
        experts = mb.routed_experts if model is self.model else None
        with self.autocast():
            share = self.share_prompt and same_prompt_within_groups(mb.input_ids, mb.prompt_lens, mb.group_ids)
            share, packed = shard.agree(model, (share, self.packs(mb, router_aux)), self.device)
            shared = (mb.prompt_lens, mb.seq_lens, mb.group_ids) if share else None
            return shard.entry(model, token_scores)(mb.input_ids, mb.attention_mask, mb.loss_mask, shared=shared,
                                chunk_rows=self.train_cfg.logprob_chunk, temperature=temperature,
                                entropy_grad=entropy_grad and torch.is_grad_enabled(),
                                gather_ids=None if gather_ids is None else gather_ids.to(self.device),
                                top_k=top_k, top_k_vocab=top_k_vocab,
                                checkpoint_layers=self.train_cfg.grad_checkpointing, truncation=truncation,
                                routed_experts=experts, router_aux=router_aux, packed=packed)

    @torch.no_grad()
    def score(self, batch: Batch, model: Any = None, *, temperature: float, top_k: int = 0,
              top_k_vocab: int | None = None, truncation: Truncation = Truncation()) -> HeadOutput:
        """No-grad forward of the batch's trained tokens in token-budget micro-batches, on the CPU:
        [N, L] log-probs and entropies, and with `top_k` the model's own top-k ids and log-probs
        [N, L, K]. `model` defaults to the policy (a frozen reference or a teacher otherwise)."""
        model = self.model if model is None else model
        n, length = batch.input_ids.shape
        host = torch.device("cpu")  # the results are gathered on the host, micro-batch by micro-batch
        lp, ent = torch.zeros(n, length, device=host), torch.zeros(n, length, device=host)
        topk_lp = torch.zeros(n, length, top_k, device=host) if top_k else None
        topk_ids = torch.zeros(n, length, top_k, dtype=torch.long, device=host) if top_k else None
        self.model.eval()  # scoring: no dropout (LoRA's included)
        try:
            for idx in self.micro_batches(batch):
                out = self.forward(model, batch.select(idx), temperature=temperature, top_k=top_k,
                                   top_k_vocab=top_k_vocab, truncation=truncation)
                rows, width = torch.as_tensor(idx), out.logprobs.shape[1]
                lp[rows, :width], ent[rows, :width] = out.logprobs.cpu(), out.entropy.cpu()
                if topk_lp is not None and topk_ids is not None:
                    topk_lp[rows, :width], topk_ids[rows, :width] = out.topk_logprobs.cpu(), out.topk_ids.cpu()
        finally:
            self.model.train()
        return HeadOutput(lp, ent, topk_logprobs=topk_lp, topk_ids=topk_ids)

    def logprobs(self, batch: Batch, *, temperature: float, reference: bool = False,
                 truncation: Truncation = Truncation()) -> torch.Tensor:
        """[N, L] log-probs of the batch's trained tokens under the policy (or the frozen reference), at the
        sampler's temperature and truncation."""
        return self.score(batch, self.reference() if reference else self.model, temperature=temperature,
                          truncation=truncation).logprobs

    def outputs(self, mb: Batch, spec: "Forward") -> "ModelOutputs":
        """What an objective's loss reads of one micro-batch (on this device), as its `Forward` says: the
        LM head's log-probs and entropies (with top-k or gathered ids), or a scalar head's values or scores."""
        if spec.head == "lm":
            gather = getattr(mb, spec.gather) if spec.gather is not None else None
            return self.forward(self.model, mb, temperature=spec.temperature, entropy_grad=spec.entropy_grad,
                                gather_ids=gather, top_k=spec.top_k, truncation=spec.truncation,
                                router_aux=spec.router_aux)
        with self.autocast():
            if spec.head == "token_values":
                return token_values(self.model, mb)
            return self.model.sequence_scores(mb.input_ids, mb.attention_mask)

    # ------------------------------------------------------------------ update

    def mini_batches(self, batch: Batch, step: int, updates: int | None = None,
                     epochs: int | None = None) -> Iterator[Batch]:
        """The batch split into `updates` mini-batches (default train.updates_per_batch), for each
        of `epochs` passes (default train.epochs_per_batch); whole groups stay together."""
        t = self.train_cfg
        updates = updates or t.updates_per_batch
        gen = torch.Generator().manual_seed(t.seed * 1_000_003 + step)
        for _ in range(epochs or t.epochs_per_batch):
            groups = batch.group_ids.unique()
            groups = groups[torch.randperm(len(groups), generator=gen)] if updates > 1 else groups
            for part in torch.tensor_split(groups, min(updates, len(groups))):
                rows = torch.nonzero(torch.isin(batch.group_ids, part)).flatten()
                yield batch.select(rows)

    def update(self, batch: Batch, step: int, objective: "Objective", updates: int | None = None,
               epochs: int | None = None) -> dict[str, float]:
        """The update every trainer shares: `updates_per_batch` mini-batches x `epochs_per_batch`
        optimiser steps (or `updates` x `epochs` when given), each accumulated over token-budget
        micro-batches. The batch is first `prepared` for the objective (old log-probs when it asks);
        each micro-batch's forward is the one the objective declares (`Objective.forward`: the policy's
        log-probs and entropies, with top-k or gathered ids, or a scalar head's outputs), and its loss
        gives the micro-batch's share of the mini-batch loss (normalised by the mini-batch's token and
        sequence counts) and per-token-mean metrics. Rows an objective `skip`s, whose loss and gradient
        are exactly 0, are not forwarded; the loss's normalisers still count them, so the update equals
        the one over every row."""
        batch = self.prepared(batch, objective)
        tally = Tally()
        for mini in self.mini_batches(batch, step, updates, epochs):
            forwarded = self.accumulate(mini, objective, loss_normalizers(mini.loss_mask), tally)
            self.optimizer_step(forwarded, tally)
        return self.update_metrics(tally, objective, batch)

    def prepared(self, batch: Batch, objective: "Objective") -> Batch:
        """The batch as the objective trains on it: with the policy's log-probs before the update when it
        asks for them (`needs_old_logprobs`), then through its `prepare`."""
        if objective.needs_old_logprobs and batch.old_logprobs is None:
            batch = replace(batch, old_logprobs=self.logprobs(batch, temperature=objective.temperature,
                                                              truncation=objective.forward.truncation))
        return objective.prepare(batch)

    def accumulate(self, mini: Batch, objective: "Objective", norms: dict[str, float], tally: "Tally") -> int:
        """Forward and backward `mini` (a mini-batch, or a piece of one) in token-budget micro-batches,
        each loss normalised by `norms`, adding to the gradients and to `tally`; the rows forwarded."""
        if objective.skips_rows:
            keep = ~objective.skip_rows(mini)
            tally.sums["rows_skipped"] += float((~keep).sum())
            mini = mini.select(torch.nonzero(keep).flatten())
        tally.sums["rows"] += float(mini.size)
        mine = tally.mine
        for idx, weight in self.rank_micro_batches(mini, objective.whole_groups):
            mb = mini.select(idx).to(self.device)
            out = self.outputs(mb, objective.forward)
            result = objective.loss(out, mb, norms)
            loss, metrics = result.loss, result.metrics
            (loss * weight).backward()
            if not weight:  # a padding pass (FSDP: every rank runs as many forwards): nothing counted
                objective.forget_last()
                continue
            mine["forwarded"] += float(self.forwarded_tokens(mb))
            ntok = float(mb.loss_mask.sum())
            mine["tokens"] += ntok
            mine["loss"] += float(loss.detach())
            if isinstance(out, HeadOutput):  # the LM head's mean entropy over the trained tokens
                mine["entropy"] += float((out.entropy.detach() * mb.loss_mask).sum())
            for k, v in metrics.items():
                mine[k] += float(v) * ntok
        return mini.size

    def optimizer_step(self, forwarded: int, tally: "Tally") -> None:
        """One optimiser step on the accumulated gradients (summed across ranks, clipped; skipped and
        counted when not finite); with no row `forwarded`, on zero gradients, as it would have been."""
        shard.sum_gradients(self.model)
        if forwarded == 0:  # every row skipped: the optimiser steps on zero gradients, as it would have
            for p in self.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        clip = self.optim_cfg.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        norm = shard.plain(norm)  # FSDP: a DTensor
        if self.nonfinite.skip(norm, self.optimizer):  # NaN/inf gradient: no update, counted
            return
        tally.sums["grad_norm"] += float(norm)
        tally.sums["updates"] += 1
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def update_metrics(self, tally: "Tally", objective: "Objective", batch: Batch) -> dict[str, float]:
        """The update's metrics from its tally (micro-batch sums gathered over every rank) and the objective's."""
        sums = tally.sums
        sums.update(group.gather_sums(tally.mine))  # over every rank's micro-batches
        tokens = sums.pop("tokens", 0.0)
        n_updates = max(sums.pop("updates", 0.0), 1.0)
        skipped, rows = sums.pop("rows_skipped", 0.0), sums.pop("rows", 0.0)
        out = {"loss": sums.pop("loss", 0.0) / n_updates, "grad_norm": sums.pop("grad_norm", 0.0) / n_updates,
               "lr": self.scheduler.get_last_lr()[0], "learner/tokens": sums.pop("forwarded", 0.0),
               "learner/nonfinite_skipped": self.nonfinite.take()}
        if objective.skips_rows:
            out["learner/rows_skipped_frac"] = skipped / max(skipped + rows, 1.0)
        if tokens:  # per-token means over the forwarded rows (none when every row was skipped)
            out.update({k: v / tokens for k, v in sums.items()})
        out.update(objective.finish(batch))
        return out

    # ------------------------------------------------------------------ state and export

    def state(self) -> dict[str, Any]:
        """Optimiser and schedule state for a checkpoint (the weights are saved with the model; across
        ranks the optimiser state goes into the sharded checkpoint, see `save_sharded`)."""
        optimizer = self.optimizer.state_dict() if group.world() == 1 else SHARDED_STATE
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what `state` saved (a sharded optimiser state was restored by `load_sharded`)."""
        if state["optimizer"] != SHARDED_STATE:
            self.optimizer.load_state_dict(moments_as(state["optimizer"], self.optimizer))
        self.scheduler.load_state_dict(state["scheduler"])

    def snapshot(self) -> dict[str, Any]:
        """What `restore` brings back: copies (in memory) of the trainable weights and of the optimiser
        and schedule state (e.g. an update check that may veto the update about to be made)."""
        import copy

        weights = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        return {"weights": weights, "state": copy.deepcopy(self.state())}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Undo every update since `snapshot`: its weights and optimiser state back in place."""
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in snapshot["weights"]:
                    p.copy_(snapshot["weights"][n])
        self.load_state(snapshot["state"])

    def save_sharded(self, path: Path) -> None:
        """Every rank: the weights and optimiser state as DCP shards under `path`, loadable on any number of ranks."""
        from upslope.distributed.checkpoint import save_sharded

        save_sharded(path, self.model, self.optimizer)

    def load_sharded(self, path: Path) -> None:
        """Every rank: restore what `save_sharded` wrote, whatever number of ranks wrote it."""
        from upslope.distributed.checkpoint import load_sharded

        load_sharded(path, self.model, self.optimizer)

    def load_full(self, weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        """Every rank: a one-process checkpoint's weights and optimiser state, each rank keeping its shards."""
        from upslope.distributed.checkpoint import load_full

        load_full(self.model, self.optimizer, weights, optimizer_state)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The full weights by HF name for an HF-format export: gathered from the shards onto rank 0
        (empty on the other ranks; every rank must call it), the model's own state dict in one process.
        With LoRA only the adapter's (trainable) parameters: the checkpoint holds the adapter alone."""
        if group.world() == 1:
            return self.model.state_dict()
        if self.lora_cfg.enabled:
            adapter = ((n, shard.plain(p.detach()).cpu()) for n, p in self.model.named_parameters() if p.requires_grad)
            return {n: t for n, t in adapter if group.is_main()}
        from upslope.distributed.checkpoint import gathered_weights

        return gathered_weights(self.model)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's parameters by HF name, for pushing into the rollout engine. With LoRA only
        the blocks the adapter changes, merged (the engine keeps the frozen rest since its start)."""
        if self.lora_cfg.enabled:  # across ranks: gathered one tensor at a time, on rank 0
            yield from lora.merged_weights(self.model, group.is_main())
            return
        if group.world() > 1:  # one full parameter at a time from the shards, on rank 0
            yield from shard.full_weights(self.model, group.is_main())
            return
        for name, p in self.model.named_parameters():
            yield name, p.detach()
