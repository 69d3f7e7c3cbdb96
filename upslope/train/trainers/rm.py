"""`upslope rm`: reward-model training on the shared loop.

The reward model is a scalar head on a causal LM (`upslope.scalar_head`) trained by
its own `Updater` with the Bradley-Terry objective. Pairs come from a file (rm.source=dataset,
the formats of `upslope dpo`) or from the policy's own samples (rm.source=on_policy):
rollout.n completions per prompt through the engine, scored by the configured (verifiable)
reward(s); a group whose rewards differ gives one pair, a best against a worst completion, or with
rm.pairs=lookahead_steps a tree rollout gives PRISM's contrastive step pair (`lookahead_step_pairs`).
The engine keeps the initial policy: it is never sent the reward model's weights.

Evaluation is pairwise accuracy on held-out pairs (the file's last rm.eval_pairs, or
rm.eval_path; on-policy: best-against-worst pairs of complete replies, whatever rm.pairs, built once
from the evaluation prompts). Checkpoints are
Hugging Face sequence-classification models (`AutoModelForSequenceClassification`), usable
as the `reward_model` reward's path.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from upslope.batch import Batch
from upslope.data.pairs import PreferencePair, load_pairs, reply_ids
from upslope.data.samplers import UniformSampler
from upslope.errors import ConfigError, DataError
from upslope.logs.plot import plot_curves
from upslope.logs.sinks import read_metrics
from upslope.models import load_tokenizer, resolve_model
from upslope.train.learner.objectives import BradleyTerryObjective, pair_metrics
from upslope.scalar_head import score_rows, scalar_loader, tokenizer_difference
from upslope.train.collect import Rounds
from upslope.train.learner.updater import Updater
from upslope.seeding import seed_step
from upslope.train.loop import BaseTrainer
from upslope.train.methods.pair_batch import best_worst_pairs, lookahead_step_pairs, pair_batch, pair_rows
from upslope.train.sources import LocalCollector


PAIRS = {"best_worst": best_worst_pairs, "lookahead_steps": lookahead_step_pairs}  # rm.pairs


class RMTrainer(BaseTrainer):
    """Bradley-Terry reward-model training: each step takes rm.pairs_per_step pairs and makes
    one optimiser step (train.updates_per_batch x train.epochs_per_batch) on them."""

    pushes_weights = False  # the engine samples from the initial policy, never from the reward model

    @property
    def uses_engine(self) -> bool:  # type: ignore[override]
        return self.cfg.rm.source == "on_policy"

    def check_config(self) -> None:
        cfg, r = self.cfg, self.cfg.rm
        if r.source == "dataset" and not r.path:
            raise ConfigError("rm.path: rm.source=dataset needs a file of pairs (JSONL, Parquet or an HF dataset "
                              "directory with prompt, chosen and rejected fields)")
        if r.source == "on_policy" and (r.path or r.eval_path):
            raise ConfigError(f"rm.path={r.path or r.eval_path}: pairs are read from a file only with "
                              f"rm.source=dataset")
        if r.source == "on_policy" and cfg.rollout.n < 2:
            raise ConfigError(f"rollout.n={cfg.rollout.n}: on-policy pairs compare completions of the same prompt, "
                              f"so rollout.n >= 2")
        if r.pairs == "lookahead_steps" and cfg.rollout.kind != "tree":
            raise ConfigError(f"rm.pairs=lookahead_steps: step pairs come from a tree rollout's sibling steps; set "
                              f"rollout.kind=tree (got {cfg.rollout.kind!r})")
        if cfg.lora.enabled:
            raise ConfigError("lora.enabled: upslope rm trains every weight of the reward model (LoRA is not "
                              "supported for it); set lora.enabled=false")
        if cfg.train.updates_per_batch > r.pairs_per_step:
            raise ConfigError(f"train.updates_per_batch={cfg.train.updates_per_batch}: cannot split "
                              f"{r.pairs_per_step} pairs into more mini-batches than pairs")

    def setup(self) -> None:
        cfg, r = self.cfg, self.cfg.rm
        tok = self.runtime.tokenizer
        self.pad_id = tok.pad_token_id
        self.rm_path = resolve_model(r.model, option="rm.model") if r.model else self.runtime.model_path
        if r.model:
            diff = tokenizer_difference(load_tokenizer(self.rm_path), tok)
            if diff:
                raise ConfigError(f"rm.model={r.model}: its tokenizer differs from model.name's ({diff}); the "
                                  f"pairs are tokenised once, so both must share one tokenizer")
        self.held_out: Batch | None = None
        if r.source == "dataset":
            pairs = load_pairs(r, "rm")
            if r.eval_path:
                held = load_pairs(r.model_copy(update={"path": r.eval_path, "limit": None}), "rm")
            else:
                if len(pairs) <= r.eval_pairs:
                    raise ConfigError(f"rm.eval_pairs={r.eval_pairs}: {r.path} has only {len(pairs)} pairs; "
                                      f"hold out fewer or give rm.eval_path")
                pairs, held = pairs[:-r.eval_pairs], pairs[-r.eval_pairs:]
            self.pairs, held_ids = self.encode_pairs(pairs), self.encode_pairs(held[:r.eval_pairs])
            if not self.pairs or not held_ids:
                raise DataError(f"{r.path}: no {'training' if not self.pairs else 'held-out'} pair is left after "
                                f"dropping prompts over rollout.max_prompt_tokens")
            self.held_out = self.file_batch(held_ids)
            self.sampler = UniformSampler(len(self.pairs), seed=cfg.train.seed, shuffle=r.shuffle)
            self.report.note(f"{len(self.pairs)} training and {self.held_out.num_groups} held-out preference pairs "
                             f"from {r.eval_path or r.path}")
        else:
            self.setup_task()
            self.rounds = self.pair_rounds(r.pairs_per_step, cfg.rollout.max_resample_rounds)
            self.keep = PAIRS[r.pairs]

    def pair_rounds(self, want: int, max_rounds: int) -> Rounds:
        """Rollout + reward rounds of rollout.prompts_per_step prompts until `want` groups had differing rewards."""
        return Rounds(want=want, per_round=self.cfg.rollout.prompts_per_step, refill=False, max_rounds=max_rounds,
                      merge_repeats=self.merge_repeats)

    def make_updater(self) -> Updater:
        """The reward model on its own Updater; train.grad_checkpointing recomputes each decoder layer
        in backward (HF's gradient checkpointing)."""
        train = self.cfg.train.model_copy(update={"share_prompt": False})
        updater = Updater(self.rm_path, self.cfg.model, train, self.cfg.optim, self.cfg.lora, self.device,
                          loader=scalar_loader(pad_id=self.pad_id), dist=self.cfg.dist)
        if train.grad_checkpointing:
            updater.model.net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return updater

    def setup_objective(self) -> None:
        self.objective = BradleyTerryObjective(self.cfg.rm.margin, self.cfg.rm.calibration_coef)

    def title(self) -> str:
        return f"reward model ({self.cfg.rm.source.replace('_', '-')} pairs)"

    # ------------------------------------------------------------------ pairs

    def encode_pairs(self, pairs: list[PreferencePair]) -> list[tuple[list[int], list[int], list[int]]]:
        """(prompt ids, chosen ids, rejected ids) of each pair, through the chat template."""
        prompt_ids, kept = self.encode_prompts([p.prompt for p in pairs])
        kept_ids = {id(ex) for ex in kept}
        pairs = [p for p in pairs if id(p.prompt) in kept_ids]
        tok = self.runtime.tokenizer
        end = tok.eos_token_id if tok.eos_token_id in self.runtime.stop_ids else self.runtime.stop_ids[0]
        return [(p, c, r) for p, (c, r) in zip(prompt_ids, reply_ids(pairs, tok, end))]

    def file_batch(self, pairs: list[tuple[list[int], list[int], list[int]]]) -> Batch:
        p, c, r = zip(*pairs)
        return pair_batch(p, c, r, list(range(len(pairs))), self.pad_id)

    def on_policy_pairs(self, step: int) -> tuple[Batch, dict[str, Any]]:
        """The step's pairs: each group with differing rewards gives its best and its worst completion."""
        got = self.source.next(step)
        got.metrics["pairs/built"] = float(got.kept_groups)
        return got.batch, got.metrics

    def held_out_pairs(self) -> Batch:
        """The evaluation pairs: on-policy, built once (seeded) from the evaluation prompts."""
        if self.held_out is None:
            assert self.task is not None
            prompt_ids, examples = self.encode_prompts(self.eval_examples)
            task = replace(self.task, prompt_ids=prompt_ids, examples=examples, tokenizer=None)
            rounds = -(-len(examples) // self.cfg.rollout.prompts_per_step)  # each evaluation prompt at most once
            source = LocalCollector(self.cfg, self.runtime, task, UniformSampler(len(examples), shuffle=False),
                                    replace(self.pair_rounds(self.cfg.rm.eval_pairs, rounds - 1), merge_repeats=False),
                                    best_worst_pairs, self.rollout, self.clock)
            self.held_out = source.next(0).batch
        return self.held_out

    # ------------------------------------------------------------------ step and evaluation

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        if self.uses_engine:
            batch, metrics = self.on_policy_pairs(step)
        else:
            batch = self.file_batch([self.pairs[i] for i in self.sampler.next(self.cfg.rm.pairs_per_step)])
            metrics = {"pairs/built": float(batch.num_groups)}
        metrics["pairs/kept"] = float(batch.num_groups) if batch.size else 0.0
        if batch.size == 0:
            metrics["skipped"] = 1.0  # no group had differing rewards: nothing to learn from this step
            return metrics
        with self.clock("learner"):
            metrics.update(self.updater.update(batch, step, self.objective))
        return metrics

    def evaluate(self, step: int) -> dict[str, Any]:
        """Pairwise accuracy of the reward model on the held-out pairs, and the calibration of sigmoid(score)
        as the probability that a reply is the acceptable one (`ece`, `brier`: chosen 1, rejected 0)."""
        batch = self.held_out_pairs()
        if batch.size == 0:
            self.report.warn("no held-out pairs (no evaluation prompt had completions with differing rewards)")
            return {}
        u = self.updater
        scores = score_rows(u.model, batch, int(self.cfg.train.micro_batch_tokens), u.device, u.autocast())
        assert batch.rewards is not None
        chosen, rejected = pair_rows(batch.group_ids, batch.rewards)
        summary: dict[str, Any] = {k.removeprefix("rm/"): v for k, v in
                                   pair_metrics(scores[chosen], scores[rejected]).items()}
        summary.update(score_calibration(scores, batch.rewards))
        summary["pairs"] = int(chosen.numel())
        self.logger.log(step, {f"eval/rm_{k}": float(v) for k, v in summary.items()})
        self.report.result(f"eval @ step {step}: pairwise accuracy {summary['accuracy']:.3f} "
                           f"({summary['pairs']} held-out pairs, mean margin {summary['margin']:+.3f})")
        return summary

    def finish(self, results: dict[str, Any]) -> None:
        records = read_metrics(self.logger.path) if self.logger.jsonl else []
        png = plot_pairwise(records, self.run_dir / "rm_accuracy.png", self.title()) \
            if self.cfg.log.plot and records else None
        if "before" in results or "after" in results:
            fmt = lambda r: "-" if r.get("accuracy") is None else f"{r['accuracy']:.3f}"  # noqa: E731
            self.report.result(f"held-out pairwise accuracy: before {fmt(results.get('before', {}))} -> after "
                               f"{fmt(results.get('after', {}))}")
        self.report.note(f"run directory: {self.run_dir}" + (f"; plot: {png}" if png else "")
                         + f"; the reward model: {self.run_dir / 'checkpoints'}/step_NNNNNN (reward_model path)")

    # ------------------------------------------------------------------ checkpoint state

    def extra_state(self) -> dict[str, Any]:
        return {"rm_held_out": self.held_out} if self.uses_engine and self.held_out is not None else {}

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        if self.uses_engine and state.get("rm_held_out") is not None:
            self.held_out = state["rm_held_out"]


def score_calibration(scores: Any, labels: Any) -> dict[str, float]:
    """ECE (10 bins) and Brier score of sigmoid(score) against each row's label (>= 0.5: acceptable)."""
    from upslope.eval.calibration import brier_score, expected_calibration_error

    probs = scores.float().sigmoid().tolist()
    good = [float(v) >= 0.5 for v in labels.tolist()]
    return {"ece": expected_calibration_error(probs, good), "brier": brier_score(probs, good)}


def plot_pairwise(records: list[dict[str, Any]], out: Path, title: str) -> Path | None:
    """Pairwise accuracy per step: on each step's training pairs (before its update) and on the held-out pairs."""
    return plot_curves(records, out, [("rm/accuracy", "training pairs", {"lw": 1.0, "alpha": 0.7}),
                                      ("eval/rm_accuracy", "held-out pairs", {"fmt": "o-", "color": "black"})],
                       title, ylabel="pairwise accuracy")
