"""Python API: `upslope.train(config)`."""
from __future__ import annotations

from typing import Any

from upslope.config import Config, load_config


def train(config: Config | str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train with a Config (or a recipe path plus overrides); returns the before/after eval."""
    from upslope.train.loop import Trainer

    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()
