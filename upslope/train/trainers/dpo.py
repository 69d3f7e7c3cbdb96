"""`upslope dpo`: preference optimisation (DPO, IPO, SimPO) on the shared loop.

Pairs come from a file (dpo.source=dataset) or from the policy's own samples: rollout.n
completions per prompt through the engine, scored by the configured reward(s); a group
whose rewards differ gives one pair, its best against its worst completion.

Reference log-probs are computed once per pair, never per epoch: for file pairs before
the first update, with the policy itself (the initial policy is the reference, so no
second model is loaded) and cached (in checkpoints too); for on-policy pairs once per
rollout batch, with the frozen initial model (loaded once, only when the loss needs it).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from upslope.batch import Batch
from upslope.data.pairs import load_pairs, reply_ids
from upslope.data.samplers import UniformSampler
from upslope.errors import ConfigError, UpslopeError
from upslope.registry import PREFERENCE_LOSSES
from upslope.train.collect import Rounds
from upslope.seeding import seed_step
from upslope.train.loop import BaseTrainer
from upslope.train.learner.objectives import PreferenceObjective
from upslope.train.methods.pair_batch import best_worst_pairs, completion_slices, completion_values, pair_batch

REF_CHUNK = 64  # pairs per no-grad batch when computing the reference log-probs of file pairs


class DPOTrainer(BaseTrainer):
    """Preference optimisation: each step takes `dpo.pairs_per_step` pairs and updates the
    policy with the configured preference loss through `Updater.update`."""

    @property
    def uses_engine(self) -> bool:  # type: ignore[override]
        return self.cfg.dpo.source == "on_policy"

    def setup_objective(self) -> None:
        # log-probs of the model's own distribution (temperature 1), whatever temperature sampled the pairs
        self.objective = PreferenceObjective(self.loss_fn)
        if self.needs_reference and self.uses_engine:
            self.updater.reference()

    def check_config(self) -> None:
        cfg, d = self.cfg, self.cfg.dpo
        PREFERENCE_LOSSES.get(d.loss.name, "dpo.loss.name")
        if d.source == "dataset" and not d.path:
            raise ConfigError("dpo.path: dpo.source=dataset needs a file of pairs (JSONL, Parquet or an HF dataset "
                              "directory)")
        if d.source == "on_policy" and d.path:
            raise ConfigError(f"dpo.path={d.path}: pairs are read from a file only with dpo.source=dataset")
        if d.source == "on_policy" and cfg.rollout.n < 2:
            raise ConfigError(f"rollout.n={cfg.rollout.n}: on-policy pairs compare completions of the same prompt, "
                              f"so rollout.n >= 2")
        if cfg.train.updates_per_batch > d.pairs_per_step:
            raise ConfigError(f"train.updates_per_batch={cfg.train.updates_per_batch}: cannot split "
                              f"{d.pairs_per_step} pairs into more mini-batches than pairs")
        if cfg.algo.kl_coef > 0:
            raise ConfigError(f"algo.kl_coef={cfg.algo.kl_coef}: preference losses hold the policy near the "
                              f"reference through dpo.loss.options.beta; set algo.kl_coef=0")

    def setup(self) -> None:
        cfg, d = self.cfg, self.cfg.dpo
        self.loss_fn = PREFERENCE_LOSSES.bind(d.loss.name, d.loss.options, where="dpo.loss.options")
        self.needs_reference = bool(PREFERENCE_LOSSES.get(d.loss.name).traits.reference)
        self.pad_id = self.runtime.tokenizer.pad_token_id
        self.ref_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None  # file pairs: index -> (c, r)
        if d.source == "dataset":
            pairs = load_pairs(d)
            prompt_ids, kept = self.encode_prompts([p.prompt for p in pairs])
            kept_ids = {id(ex) for ex in kept}
            pairs = [p for p in pairs if id(p.prompt) in kept_ids]
            tok = self.runtime.tokenizer
            end = tok.eos_token_id if tok.eos_token_id in self.runtime.stop_ids else self.runtime.stop_ids[0]
            replies = reply_ids(pairs, tok, end)
            self.pairs = [(p, c, r) for p, (c, r) in zip(prompt_ids, replies)]
            self.sampler = UniformSampler(len(self.pairs), seed=cfg.train.seed, shuffle=d.shuffle)
            self.report.note(f"{len(self.pairs)} preference pairs from {d.path}")
        else:
            self.setup_task()
            r = cfg.rollout
            self.rounds = Rounds(want=d.pairs_per_step, per_round=r.prompts_per_step, refill=False,
                                 max_rounds=r.max_resample_rounds, merge_repeats=self.merge_repeats)
            self.keep = best_worst_pairs

    def title(self) -> str:
        return f"dpo ({self.cfg.dpo.loss.name}, {self.cfg.dpo.source.replace('_', '-')} pairs)"

    # ------------------------------------------------------------------ pairs

    def file_pairs(self, indices: list[int]) -> Batch:
        """The pair batch of these file pairs (group k: the k-th index), with cached reference log-probs."""
        p, c, r = zip(*(self.pairs[i] for i in indices))
        batch = pair_batch(p, c, r, list(range(len(indices))), self.pad_id)
        if self.needs_reference:
            assert self.ref_cache is not None
            missing = [i for i in indices if i not in self.ref_cache]
            if missing:  # only when train.steps grew on resume: the initial policy is gone
                raise UpslopeError(f"pair {missing[0]} of {self.cfg.dpo.path} has no cached reference log-probs "
                                   f"(train.steps was raised after the run started); start a new run")
            batch = replace(batch, ref_logprobs=completion_values(batch, [t for i in indices
                                                                         for t in self.ref_cache[i]]))
        return batch

    def cache_reference(self) -> None:
        """Reference log-probs of every file pair this run will draw, computed once with the policy
        before its first update (it is the reference then)."""
        if self.ref_cache is not None or not self.needs_reference:
            return
        t, n = self.cfg.train, len(self.pairs)
        draws = t.steps * self.cfg.dpo.pairs_per_step  # the sampler is seeded: replay its draws
        order = UniformSampler(n, seed=t.seed, shuffle=self.cfg.dpo.shuffle)
        needed = list(range(n)) if draws >= n else sorted(set(order.next(draws)))
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for s in range(0, len(needed), REF_CHUNK):
            chunk = needed[s:s + REF_CHUNK]
            p, c, r = zip(*(self.pairs[i] for i in chunk))
            batch = pair_batch(p, c, r, chunk, self.pad_id)
            rows = completion_slices(self.updater.logprobs(batch, temperature=self.objective.temperature), batch)
            for k, i in enumerate(chunk):
                cache[i] = (rows[2 * k], rows[2 * k + 1])
        self.ref_cache = cache

    def collect_pairs(self, step: int) -> tuple[Batch, dict[str, Any]]:
        """On-policy pairs: rollout + reward rounds until dpo.pairs_per_step groups had differing
        rewards (at most 1 + rollout.max_resample_rounds rounds); each such group gives its best
        and its worst completion."""
        got = self.source.next(step)
        got.metrics["pairs/built"] = float(got.kept_groups)
        return got.batch, got.metrics

    # ------------------------------------------------------------------ step

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        if self.uses_engine:
            batch, metrics = self.collect_pairs(step)
        else:
            with self.clock("reference"):
                self.cache_reference()
            batch = self.file_pairs(self.sampler.next(self.cfg.dpo.pairs_per_step))
            metrics = {"pairs/built": float(batch.num_groups)}
        metrics["pairs/kept"] = float(batch.num_groups) if batch.size else 0.0
        if batch.size == 0:
            metrics["skipped"] = 1.0  # no group had differing rewards: nothing to learn from this step
            return metrics
        assert bool((batch.loss_mask.sum(1) > 0).all()), "every reply has at least its end token"
        if self.needs_reference and batch.ref_logprobs is None:  # on-policy: once per rollout batch
            with self.clock("reference"):
                batch = replace(batch, ref_logprobs=self.updater.logprobs(batch, temperature=self.objective.temperature,
                                                                          reference=True))
        with self.clock("learner"):
            metrics.update(self.updater.update(batch, step, self.objective))
        if self.uses_engine:
            with self.clock("sync"):
                self.push_weights()
        return metrics

    # ------------------------------------------------------------------ checkpoint state

    def extra_state(self) -> dict[str, Any]:
        return {"dpo_reference": self.ref_cache} if self.ref_cache is not None else {}

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        if self.cfg.dpo.source == "dataset" and self.needs_reference:
            if "dpo_reference" not in state:
                raise UpslopeError(f"{path}: checkpoint has no cached reference log-probs for the pairs")
            self.ref_cache = state["dpo_reference"]
