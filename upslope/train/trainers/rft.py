"""`upslope rft`: rejection-sampling fine-tuning (expert iteration). Each train step is one
round: sample rollout.n completions for rft.prompts_per_round prompts with the current policy,
keep those whose reward passes rft.threshold, fine-tune on them with the SFT loss (rft.epochs
passes, mini-batches of about rft.batch_size samples), push the weights to the engine."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from upslope.algos.rejection import keep_indices
from upslope.batch import Batch
from upslope.errors import ConfigError
from upslope.train.collect import Rounds
from upslope.seeding import seed_step
from upslope.train.loop import BaseTrainer
from upslope.train.learner.objectives import SupervisedObjective
from upslope.train.trainers.sft import check_supervised

SAMPLES_FILE = "rft_samples.jsonl"


class RFTTrainer(BaseTrainer):
    """Rounds of sample -> reward -> keep -> fine-tune -> sync; `train.steps` is the number of
    rounds, and `train.eval_every=1` evaluates after every round."""

    def check_config(self) -> None:
        check_supervised(self.cfg, "rft")
        if self.cfg.optim.schedule != "constant":
            raise ConfigError(f"optim.schedule={self.cfg.optim.schedule}: upslope rft needs a constant schedule "
                              f"(the number of updates per round depends on how many samples are kept)")

    def setup(self) -> None:
        cfg = self.cfg
        self.setup_task()
        self.rounds = Rounds(want=cfg.rft.prompts_per_round, merge_repeats=self.merge_repeats)
        self.objective = SupervisedObjective(cfg.sft.dft)  # fine-tunes the model's own distribution (temperature 1)
        self.samples_path = self.run_dir / SAMPLES_FILE
        if self.main and not cfg.train.resume and self.samples_path.exists():  # a fresh run starts a fresh file
            self.samples_path.unlink()

    def load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        """Drop samples written by rounds after the checkpoint (they are sampled again); rank 0 owns the file."""
        if self.main and self.samples_path.exists():
            step = int(state["step"])
            rows = [x for x in self.samples_path.read_text().splitlines() if json.loads(x)["round"] <= step]
            self.samples_path.write_text("".join(r + "\n" for r in rows))

    def step(self, step: int) -> dict[str, Any]:
        cfg, r = self.cfg, self.cfg.rft
        seed_step(cfg.train.seed, step)
        got = self.source.next(step)
        batch, metrics = got.batch, got.metrics
        keys = [tuple(batch.input_ids[i, int(batch.prompt_lens[i]):int(batch.seq_lens[i])].tolist())
                for i in range(batch.size)]
        kept_idx = keep_indices(batch.rewards.tolist(), batch.group_ids.tolist(), keys, threshold=r.threshold,
                                dedupe=r.dedupe, max_per_prompt=r.max_per_prompt)
        kept = batch.select(kept_idx)
        metrics.update({"rft/kept": float(len(kept_idx)), "rft/kept_frac": len(kept_idx) / batch.size,
                        "rft/prompts_with_kept": float(kept.num_groups if kept.size else 0) / got.drawn})
        if r.write_samples and self.main:
            self.write_samples(kept, [got.indices[g] for g in kept.group_ids.tolist()], step)
        if not kept.size:
            metrics["skipped"] = 1.0  # nothing passed: no update
            return metrics
        updates = math.ceil(kept.size / r.batch_size)
        with self.clock("learner"):
            metrics.update(self.updater.update(kept, step, self.objective, updates=updates, epochs=r.epochs))
        with self.clock("sync"):
            self.push_weights()
        return metrics

    def write_samples(self, kept: Batch, example_idx: list[int], step: int) -> None:
        """Append the kept samples as chat rows (the prompt's messages, then the reply), so the
        file is an `upslope sft` dataset (data.messages_field=messages)."""
        self.samples_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.samples_path, "a") as fh:
            for i, e in enumerate(example_idx):
                ex = self.examples[e]
                reply = ex.prefill + kept.meta[i]["completion"]  # a prefilled reply is the model's too
                msgs = ex.messages(self.cfg.data.system_prompt) + [{"role": "assistant", "content": reply}]
                fh.write(json.dumps({"messages": msgs, "answer": ex.answer, "reward": float(kept.rewards[i]),
                                     "round": step, "example_id": ex.id,
                                     "truncated": bool(kept.truncated[i])}, default=str) + "\n")

    def title(self) -> str:
        return "RFT (DFT)" if self.cfg.sft.dft else "RFT"
