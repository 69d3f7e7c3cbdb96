"""`upslope sft`: supervised fine-tuning (and DFT) on chat or prompt/response data, on the
shared loop (BaseTrainer) and update (Updater.update). The loss covers assistant tokens
only; evaluation is held-out accuracy on eval.data (default: the task named by data.task)."""
from __future__ import annotations

import math
from typing import Any

from upslope.config import Config, DataConfig
from upslope.data.samplers import UniformSampler
from upslope.data.sft import encode_conversations, load_conversations, sft_batch
from upslope.errors import ConfigError
from upslope.train.learner.objectives import SupervisedObjective
from upslope.seeding import seed_step
from upslope.train.loop import BaseTrainer
from upslope.train.learner.memory import release_freed_memory


def check_supervised(cfg: Config, command: str) -> None:
    """Options a supervised trainer cannot honour: one ConfigError line."""
    if cfg.algo.kl_coef > 0:
        raise ConfigError(f"algo.kl_coef={cfg.algo.kl_coef}: upslope {command} has no KL term (set algo.kl_coef=0)")


class SFTTrainer(BaseTrainer):
    """Each step: `sft.batch_size` conversations from a seeded sampler (epochs over the data,
    checkpointed), one Updater.update with the SFT loss. The engine starts only to evaluate."""

    uses_engine = False

    def __init__(self, cfg: Config):
        super().__init__(with_task_eval(cfg))

    def check_config(self) -> None:
        check_supervised(self.cfg, "sft")
        if not self.cfg.data.path:
            raise ConfigError("upslope sft needs data.path: a JSONL/Parquet file or dataset directory with a chat "
                              "(data.messages_field) or prompt/response fields per row")

    def setup(self) -> None:
        cfg, s = self.cfg, self.cfg.sft
        convs = load_conversations(cfg.data, s.response_field)
        self.examples = encode_conversations(convs, self.runtime.tokenizer, self.runtime.stop_ids,
                                             max_tokens=s.max_tokens, drop_long=s.drop_long)
        if len(self.examples) < len(convs):
            self.report.warn(f"dropped {len(convs) - len(self.examples)} conversations over sft.max_tokens")
        if s.epochs is not None:  # before the Learner exists, so its schedule spans these steps
            cfg.train.steps = max(1, math.ceil(s.epochs * len(self.examples) / s.batch_size))
        self.sampler = UniformSampler(len(self.examples), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.objective = SupervisedObjective(s.dft)  # the model's own distribution (temperature 1)

    def step(self, step: int) -> dict[str, Any]:
        seed_step(self.cfg.train.seed, step)
        with self.clock("learner"):
            idx = self.sampler.next(self.cfg.sft.batch_size)
            batch = sft_batch([self.examples[i] for i in idx], self.runtime.tokenizer.pad_token_id)
            metrics = self.updater.update(batch, step, self.objective)
            release_freed_memory(self.updater.device)
        metrics.update({"sft/trained_tokens": float(batch.num_loss_tokens()),
                        "sft/epoch": self.sampler.epoch + self.sampler.position / len(self.examples)})
        return metrics

    def title(self) -> str:
        return "SFT (DFT)" if self.cfg.sft.dft else "SFT"


def with_task_eval(cfg: Config) -> Config:
    """A copy of `cfg` whose held-out evaluation is eval.data or, when unset, the built-in task
    data.task (the training file has no held-out split or reward of its own)."""
    cfg = cfg.model_copy(deep=True)
    if cfg.eval.data is None:
        d = cfg.data
        cfg.eval.data = DataConfig(task=d.task, options=d.options, system_prompt=d.system_prompt)
    return cfg
