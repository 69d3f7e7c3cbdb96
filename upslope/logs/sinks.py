"""Metric sinks: a JSONL file, TensorBoard when installed, and a live console line."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from upslope.config import LogConfig


class MetricsLogger:
    """Writes one record per step to every enabled sink."""

    def __init__(self, run_dir: Path, cfg: LogConfig, resume_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = cfg.jsonl
        if self.jsonl and resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        elif self.jsonl and resume_step is None:
            self.path.write_text("")
        self.tb = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:
                self.tb = None

    def _truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash
            if rec.get("step", 0) <= step:
                keep.append(line)
        self.path.write_text("".join(k + "\n" for k in keep))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        if self.jsonl:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


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
