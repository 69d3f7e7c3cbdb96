"""Which of a model's layers carry a recurrent state along the sequence instead of attending.

The learner's shared-prompt forward (each group's prompt run once, its keys and values shared by the
group's completions) and its packed forward (a micro-batch's rows in one sequence, attention kept within
each row) both rely on tokens seeing each other through attention only. The recurrent layers of hybrid
models (state-space/Mamba mixers, short convolutions, gated delta-rule linear attention: LFM2,
Qwen3-Next, Granite 4, Falcon-H1, ...) carry a state from token to token instead: packed, that state
runs from one row into the next; shared, the prompt's state is not a KV cache the completions can read.
Such a model runs each row with its own prompt, padded on the right (a recurrent layer reads only the
tokens before a position, so the padding changes nothing), and says so once in one line per option.

The layers are read the way transformers builds a model's cache (`upslope.models.recurrent_layer_count`).
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

from upslope.models import recurrent_layer_count

_COUNTED: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
_SAID: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_log = logging.getLogger("upslope")


def recurrent_layers(model: Any) -> int:
    """How many of `model`'s decoder layers carry a recurrent state (0 for attention-only models and for
    models whose config transformers cannot build a cache from)."""
    if model in _COUNTED:
        return _COUNTED[model]
    config = getattr(model, "config", None)
    count = 0 if config is None else recurrent_layer_count(config)
    _COUNTED[model] = count
    return count


# the learner options that rely on attention alone, and what the learner does instead for a hybrid
INSTEAD = {"train.share_prompt": "each row runs its own prompt",
           "train.packing": "this model runs padded micro-batches"}


def sets_aside(model: Any, option: str) -> bool:
    """True when `model` has recurrent layers, so that `option` (one of INSTEAD) is set aside for it; said
    once per model and option."""
    count = recurrent_layers(model)
    if not count:
        return False
    said = _SAID.setdefault(model, set())
    if option not in said:
        said.add(option)
        _log.warning(f"{option}: {type(model).__name__} has {count} recurrent layer{'s' if count > 1 else ''} "
                     f"(a state carried along the sequence, not attention); {INSTEAD[option]}")
    return True
