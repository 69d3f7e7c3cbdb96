"""reasoning-gym's procedural generators as a task: `data.task=reasoning_gym` with
`data.options.dataset=<generator>` (any of the package's ~100: leg_counting, basic_arithmetic,
letter_counting, ...), scored by the generator's own verifier (the `reasoning_gym` reward).

Each split is generated from its own seed; the held-out split drops any question the training split
also holds and any repeat of its own (small generators repeat questions), so it is held out in fact and
each of its questions counts once. The package
is optional: `pip install reasoning-gym` (upslope's extra `reasoning-gym`)."""
from __future__ import annotations

import functools
import json
from typing import Any

from upslope.bounds import PositiveCount
from upslope.data.types import Example
from upslope.errors import ConfigError, DataError, did_you_mean
from upslope.registry import TASKS

_TEST_SEED_OFFSET = 1_000_003
INSTRUCTION = "{question}\nGive only your final answer between <answer> and </answer>."
# for a small model that must reason before it answers: it ends on "Answer: X", which the reward's
# extract=final_number reads (with numeric generators)
STEP_BY_STEP = "{question}\nThink step by step, then give the final answer on the last line as \"Answer: X\"."


def reasoning_gym() -> Any:
    """The reasoning_gym package, or one ConfigError line saying how to install it."""
    try:
        import reasoning_gym as rg
    except ModuleNotFoundError:
        raise ConfigError("data.task=reasoning_gym needs the reasoning-gym package: pip install reasoning-gym "
                          "(or upslope[reasoning-gym])") from None
    return rg


@functools.lru_cache(maxsize=32)
def generator(dataset: str, config_json: str, seed: int, size: int) -> Any:
    """One reasoning-gym dataset object (cached: the reward scores with the object that generated)."""
    rg = reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        hint = did_you_mean(dataset, DATASETS)
        raise ConfigError(f"data.options.dataset: reasoning-gym has no generator '{dataset}'{hint}; "
                          f"{len(DATASETS)} exist, e.g. {', '.join(sorted(DATASETS)[:6])}")
    try:
        return rg.create_dataset(dataset, seed=seed, size=size, **json.loads(config_json))
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"data.options.config: reasoning-gym's '{dataset}' refuses it ({type(exc).__name__}: "
                          f"{exc})") from None


def _entries(dataset: str, config: dict[str, Any], seed: int, size: int) -> list[dict[str, Any]]:
    gen = generator(dataset, json.dumps(config, sort_keys=True), seed, size)
    try:
        return [gen[i] for i in range(size)]
    except Exception as exc:  # a generator's own failure on this config
        raise DataError(f"reasoning-gym's '{dataset}' failed to generate ({type(exc).__name__}: {exc})") from None


@TASKS.register("reasoning_gym", reward="reasoning_gym", max_new_tokens=256, splits=("train", "test"))
def reasoning_gym_task(*, split: str = "train", dataset: str = "leg_counting", size: PositiveCount = 2000,
                       test_size: PositiveCount = 200, seed: int = 0, config: dict[str, Any] | None = None,
                       instruction: str = INSTRUCTION, prefill: str = "") -> list[Example]:
    """A reasoning-gym generator's problems, scored by its own verifier; the test split shares no question with train.

    split: "train" or "test" (generated from another seed, without the training split's questions or repeats)
    dataset: the generator's name in reasoning-gym (e.g. leg_counting, basic_arithmetic, letter_counting)
    size: problems in the training split
    test_size: problems generated for the test split (before the training split's questions are dropped)
    seed: random seed of the training split (the test split adds a fixed offset)
    config: the generator's own options (its config class's fields, e.g. {min_animals: 2, max_animals: 4})
    instruction: prompt template; {question} is the generator's question
    prefill: text the reply starts with, e.g. "<answer>" (with the reward's extract=first_line: the answer is what follows)
    """
    if split not in ("train", "test"):
        raise DataError(f"data.split={split!r}: task 'reasoning_gym' has only the splits train, test")
    config = dict(config or {})
    train = _entries(dataset, config, seed, size)
    if split == "train":
        entries, tag = train, "train"
    else:
        seen = {e["question"] for e in train}
        entries = []
        for e in _entries(dataset, config, seed + _TEST_SEED_OFFSET, test_size):
            if e["question"] not in seen:  # neither a training question nor one already in the test split
                seen.add(e["question"])
                entries.append(e)
        tag = "test"
        if not entries:
            raise DataError(f"reasoning-gym's '{dataset}' has no test question outside the {size} training ones; "
                            "widen its config or lower data.options.size")
    out = []
    for i, e in enumerate(entries):
        meta = {"reasoning_gym": {"dataset": dataset, "config": config, "seed": seed if tag == "train" else
                                  seed + _TEST_SEED_OFFSET, "size": size if tag == "train" else test_size,
                                  "entry": {"question": e["question"], "answer": e["answer"],
                                            "metadata": e.get("metadata", {})}}}
        out.append(Example(prompt=instruction.format(question=e["question"].strip()), answer=e["answer"], meta=meta,
                           id=f"rg-{dataset}-{tag}-{i}", prefill=prefill))
    return out
