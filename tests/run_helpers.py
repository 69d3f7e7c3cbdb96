"""Reading a finished test run (imported by module name: tests/ is on sys.path).

`metrics` parses a run's metrics.jsonl strictly: a line that is not JSON fails the test, where
`upslope.logs.sinks.read_metrics` (the resume path) skips a torn line on purpose.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of `run_dir`/metrics.jsonl, in order."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def learning(records: list[dict[str, Any]], *also: str) -> list[dict[str, Any]]:
    """The records without wall-clock keys (time/*, *tokens_per_s) and keys starting with any of `also`:
    what two runs of the same seed must agree on."""
    def kept(key: str) -> bool:
        return not key.startswith(("time/", *also)) and not key.endswith("tokens_per_s")

    return [{k: v for k, v in r.items() if kept(k)} for r in records]


def trained(trainer: Any) -> Any:
    """`trainer` after its run, closed even when the run fails (its engine, workers and files released)."""
    try:
        trainer.run()
    finally:
        trainer.close()
    return trainer
