"""Metric sinks: a JSONL file, the experiment trackers of `log.trackers` (TensorBoard when installed,
W&B, trackio, MLflow; upslope.logs.trackers), and a live console line."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any, Callable

from upslope.batch import Batch
from upslope.config import LogConfig
from upslope.config_base import Plugin
from upslope.errors import ConfigError
from upslope.registry import TRACKERS

ROLLOUTS_FILE = "rollouts.jsonl"


def tracker_plugins(cfg: LogConfig) -> list[tuple[str, Plugin]]:
    """(where, plugin) of each tracker to start: log.trackers, plus TensorBoard when log.tensorboard is on
    and it is installed. A tracker whose package is missing, or an unknown option, is one ConfigError
    line (checked when the run starts, before the model loads)."""
    out = []
    for i, p in enumerate(cfg.trackers):
        where = f"log.trackers[{i}]"
        TRACKERS.bind(p.name, p.options, where=f"{where}.options")
        package = TRACKERS.get(p.name).traits.package
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"{where}: tracker '{p.name}' needs the {package} package, which is not installed "
                              f"(pip install {package}, or pip install 'upslope[trackers]')")
        out.append((where, p))
    names = {p.name for p in cfg.trackers}
    if cfg.tensorboard and "tensorboard" not in names and importlib.util.find_spec("tensorboard") is not None:
        out.append(("log.tensorboard", Plugin(name="tensorboard")))
    return out


class MetricsLogger:
    """Writes one record per step to every enabled sink, and the completion tables."""

    def __init__(self, run_dir: Path, cfg: LogConfig, resume_step: int | None = None,
                 config: dict[str, Any] | None = None, announce: Callable[[str], Any] = print):
        from upslope.logs.trackers import TrackerRun

        self.path = run_dir / "metrics.jsonl"
        self.rollouts = run_dir / ROLLOUTS_FILE
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = cfg.jsonl
        for path in (self.path, self.rollouts):
            if self.jsonl and resume_step is not None and path.exists():
                _truncate_after(path, resume_step)
            elif self.jsonl and resume_step is None:
                path.write_text("")
        run = TrackerRun(run_dir, Path(run_dir).resolve().name, config or {}, announce)
        self.trackers = [TRACKERS.bind(p.name, p.options, where=f"{where}.options")(run)
                         for where, p in tracker_plugins(cfg)]

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        if self.jsonl:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        numbers = {k: float(v) for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        for tracker in self.trackers:
            tracker.log(step, numbers)

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A table of sampled completions (one dict per sample, the same keys each time) to
        rollouts.jsonl and every tracker."""
        if not rows:
            return
        if self.jsonl:
            with open(self.rollouts, "a") as fh:
                fh.writelines(json.dumps(r, default=str) + "\n" for r in rows)
        columns = list(rows[0])
        for tracker in self.trackers:
            tracker.table(step, columns, [[r.get(c) for c in columns] for r in rows])

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def sample_rows(batch: Batch, step: int, limit: int) -> list[dict[str, Any]]:
    """The first `limit` samples of a scored batch as table rows: step, group, prompt, completion, answer,
    the combined reward and each reward component."""
    rows = []
    for i, meta in enumerate(batch.meta[:limit]):
        row = {"step": step, "group": int(batch.group_ids[i]), "prompt": prompt_text(meta.get("prompt")),
               "completion": meta.get("completion", ""), "answer": str(meta.get("answer")),
               "reward": float(batch.rewards[i]) if batch.rewards is not None else None}
        row.update({f"reward/{k}": float(v[i]) for k, v in batch.reward_components.items()})
        rows.append(row)
    return rows


def prompt_text(prompt: Any) -> str:
    """A prompt as text: chat messages as `role: content` lines."""
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt if isinstance(m, dict))
    return str(prompt)


def _truncate_after(path: Path, step: int) -> None:
    """On resume, drop records of steps after the checkpoint (they will be redone)."""
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a crash
        if rec.get("step", 0) <= step:
            keep.append(line)
    path.write_text("".join(k + "\n" for k in keep))


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    return v


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl ([] when there is none yet); a torn line (a run killed
    mid-write) is skipped, as on resume."""
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
