"""Data: sources (JSONL, Parquet, HF datasets), built-in tasks, samplers."""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from upslope.data.formats import FieldMap, detect_fields
from upslope.data.sources import apply_template, read_records, records_to_examples
from upslope.data.types import Example
from upslope.errors import ConfigError, DataError
from upslope.registry import TASKS

if TYPE_CHECKING:  # data reads config sections; config consults the registries data fills
    from upslope.config import DataConfig


def is_single_file(cfg: DataConfig) -> bool:
    """Is the source one data file (which has no splits), rather than a dataset directory or a task?"""
    return bool(cfg.path) and Path(cfg.path).expanduser().is_file()


def load_examples(cfg: DataConfig, default_split: str = "train", option_prefix: str = "data",
                  announce: Callable[[str], Any] | None = None) -> list[Example]:
    """The Examples a data config names: a file/directory/Hub dataset at `path` (its field mapping
    detected from the first record where the config left it at the defaults; `announce` gets the one
    line saying what was detected), else a built-in task. Errors name the options under
    `option_prefix`, the section `cfg` came from (data, or eval.data)."""
    o = option_prefix
    if cfg.path:
        if cfg.split and is_single_file(cfg):
            raise ConfigError(f"{o}.split={cfg.split!r}: {cfg.path} is one file, with no splits ({o}.split "
                              f"picks a split of a dataset directory; point {o}.path at the split's file instead)")
        records, fields = detected_records(cfg)
        note = fields.note(cfg.path)
        if note and announce is not None:
            announce(note)
        examples = records_to_examples(records, fields.prompt_field, fields.messages_field, fields.answer_field,
                                       cfg.template, cfg.limit, option_prefix=o)
    else:
        options: dict[str, Any] = dict(cfg.options)
        entry = TASKS.get(cfg.task, f"{o}.task")
        if "split" in entry.options() and "split" not in options:
            options["split"] = task_split(cfg, default_split)
        elif cfg.split and "split" not in entry.options():
            raise ConfigError(f"{o}.split={cfg.split!r}: task '{cfg.task}' has no splits")
        fn = TASKS.bind(cfg.task, options, where=f"{o}.options")
        examples = fn()
        if cfg.template != "{prompt}":
            for ex in examples:
                if isinstance(ex.prompt, str):  # a built-in task's records have only the prompt
                    ex.prompt = apply_template(cfg.template, ex.prompt, {}, f"task {cfg.task}", f"{o}.template")
        if cfg.limit:
            examples = examples[: cfg.limit]
    if not examples:
        raise DataError(f"{o}: no examples loaded from {cfg.path or 'task ' + cfg.task}")
    return examples


def detected_records(cfg: DataConfig) -> tuple[Iterator[tuple[str, dict[str, Any]]], FieldMap]:
    """The records at cfg.path and the field mapping detected from the first one (the first record is
    read once: it is put back in front of the rest)."""
    records = read_records(cfg.path, cfg.split, cfg.subset)  # type: ignore[arg-type]
    first = next(records, None)
    if first is None:
        return iter(()), FieldMap(cfg.prompt_field, cfg.messages_field, cfg.answer_field)
    return itertools.chain([first], records), detect_fields(first[1], cfg)


def task_split(cfg: DataConfig, default_split: str) -> str:
    """The split a task reads: data.split, which must be one the task has (its registry trait `splits`),
    else `default_split`, or the task's only split when it lacks that one (MATH-500 has only 'test'; the
    loop then reports that evaluation reads the training problems)."""
    splits = TASKS.get(cfg.task, "data.task").traits.splits
    if cfg.split:
        if splits and cfg.split not in splits:
            raise ConfigError(f"data.split={cfg.split!r}: task '{cfg.task}' has only the split(s) {', '.join(splits)}")
        return cfg.split
    return default_split if not splits or default_split in splits else splits[0]


def has_split(cfg: DataConfig, split: str) -> bool:
    """Does the data source have `split`: a task that lists it (or lists none), a dataset directory or
    saved dataset holding it? A single file has no splits."""
    if not cfg.path:
        splits = TASKS.get(cfg.task, "data.task").traits.splits
        return "split" in TASKS.get(cfg.task, "data.task").options() and (not splits or split in splits)
    p = Path(cfg.path).expanduser()
    if not p.is_dir():
        return False
    from upslope.data.hfdata import directory_splits

    return split in directory_splits(p)


def example_key(ex: Example) -> str:
    """A content hash of an example's prompt and answer: the same problem read from two sources has one key."""
    text = json.dumps([ex.prompt, ex.answer], sort_keys=True, default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def overlap(train: Sequence[Example], held_out: Sequence[Example]) -> int:
    """How many held-out examples are also training examples (same prompt and answer)."""
    seen = {example_key(ex) for ex in train}
    return sum(example_key(ex) in seen for ex in held_out)


def task_default_reward(cfg: DataConfig) -> tuple[str, dict[str, Any]] | None:
    """The reward a built-in task names, when the config gives none."""
    if cfg.path:
        return None
    entry = TASKS.get(cfg.task, "data.task")
    name = entry.traits.reward
    return (name, dict(entry.traits.reward_options)) if name else None


__all__ = ["Example", "is_single_file", "has_split", "load_examples", "overlap", "task_default_reward", "read_records",
           "records_to_examples", "ConfigError", "DataError"]
