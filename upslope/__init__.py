"""upslope: reinforcement-learning post-training of language models."""
from __future__ import annotations

from typing import Any

# The package upslope.train is loaded first: loading a subpackage binds its name on its parent, and
# `upslope.train` must stay the function below however much of the package is imported later.
import upslope.train as _train_package  # noqa: F401,E402

__version__ = "0.1.0"


def train(config: Any = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train with a Config or a recipe path (see `upslope.config`), as `upslope train` does (the run
    directory checked, dist.learner_procs learner ranks); returns the before/after evaluation."""
    from upslope.api import train as _train

    return _train(config, overrides)


def load_config(path: Any = None, overrides: list[str] | None = None) -> Any:
    """A validated Config from a recipe path and dotted overrides (see `upslope.config`)."""
    from upslope.config import load_config as _load

    return _load(path, overrides)
