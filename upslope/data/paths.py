"""Where the project's shipped datasets live (GSM8K, MATH-500, AIME24, AMC23, HumanEval)."""
from __future__ import annotations

import os
from pathlib import Path


def shared_data_dir() -> Path:
    """$UPSLOPE_DATA_DIR, else ../shared/data beside the repository checkout."""
    env = os.environ.get("UPSLOPE_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "data"
