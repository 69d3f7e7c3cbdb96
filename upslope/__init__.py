"""upslope: reinforcement-learning post-training of language models."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def train(config: Any = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train with a Config or a recipe path (see `upslope.config`); returns before/after eval."""
    from upslope.api import train as _train

    return _train(config, overrides)


def load_config(path: Any = None, overrides: list[str] | None = None) -> Any:
    from upslope.config import load_config as _load

    return _load(path, overrides)
