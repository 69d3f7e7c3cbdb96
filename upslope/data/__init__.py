"""Data: sources (JSONL, Parquet, HF datasets), built-in tasks, samplers."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from upslope.data.sources import apply_template, read_records, records_to_examples
from upslope.data.types import Example
from upslope.errors import ConfigError, DataError
from upslope.registry import TASKS

if TYPE_CHECKING:  # data reads config sections; config consults the registries data fills
    from upslope.config import DataConfig


def is_single_file(cfg: DataConfig) -> bool:
    """Is the source one data file (which has no splits), rather than a dataset directory or a task?"""
    return bool(cfg.path) and Path(cfg.path).expanduser().is_file()


def load_examples(cfg: DataConfig, default_split: str = "train") -> list[Example]:
    """The Examples a data config names: a file/directory at `path`, else a built-in task."""
    if cfg.path:
        if cfg.split and is_single_file(cfg):
            raise ConfigError(f"data.split={cfg.split!r}: {cfg.path} is one file, with no splits (data.split "
                              f"picks a split of a dataset directory; point data.path at the split's file instead)")
        examples = records_to_examples(read_records(cfg.path, cfg.split), cfg.prompt_field, cfg.messages_field,
                                       cfg.answer_field, cfg.template, cfg.limit)
    else:
        options: dict[str, Any] = dict(cfg.options)
        entry = TASKS.get(cfg.task, "data.task")
        if "split" in entry.options() and "split" not in options:
            options["split"] = cfg.split or default_split
        elif cfg.split and "split" not in entry.options():
            raise ConfigError(f"data.split={cfg.split!r}: task '{cfg.task}' has no splits")
        fn = TASKS.bind(cfg.task, options, where="data.options")
        examples = fn()
        if cfg.template != "{prompt}":
            for ex in examples:
                if isinstance(ex.prompt, str):  # a built-in task's records have only the prompt
                    ex.prompt = apply_template(cfg.template, ex.prompt, {}, f"task {cfg.task}")
        if cfg.limit:
            examples = examples[: cfg.limit]
    if not examples:
        raise DataError(f"data: no examples loaded from {cfg.path or 'task ' + cfg.task}")
    return examples


def task_default_reward(cfg: DataConfig) -> tuple[str, dict[str, Any]] | None:
    """The reward a built-in task names, when the config gives none."""
    if cfg.path:
        return None
    entry = TASKS.get(cfg.task, "data.task")
    name = entry.traits.reward
    return (name, dict(entry.traits.reward_options)) if name else None


__all__ = ["Example", "is_single_file", "load_examples", "task_default_reward", "read_records", "records_to_examples",
           "ConfigError", "DataError"]
