"""Where upslope keeps what it computes once and reuses across runs: converted models, the measured
hardware peaks, generated databases, torch's compiler cache."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | None = None) -> Path:
    """The cache directory: `cache_dir` when given, else $UPSLOPE_CACHE, else ~/.cache/upslope."""
    root = cache_dir or os.environ.get("UPSLOPE_CACHE") or Path.home() / ".cache" / "upslope"
    return Path(root)


def keep_compiler_cache(cache_dir: str | None = None) -> None:
    """torch's compiler caches under the temporary directory by default (torchinductor_<user>, left behind after
    the run), and both transformers' GGUF loading and vLLM reach it: keep it in upslope's cache instead, unless
    TORCHINDUCTOR_CACHE_DIR is set (torch sets it too, on first use: call this before)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root(cache_dir) / "torchinductor"))
