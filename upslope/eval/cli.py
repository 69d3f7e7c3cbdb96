"""`upslope eval` as a command: evaluate, print a table, write the JSON summary."""
from __future__ import annotations

import json
from pathlib import Path

from typing import Any

from upslope.config import Config
from upslope.errors import UpslopeError
from upslope.eval.runner import evaluate
from upslope.logs.progress import Report, console, summary_table
from upslope.runtime import Runtime


def run_eval_command(cfg: Config) -> int:
    out_dir = Path(cfg.run_dir)
    check_outputs(out_dir, "eval")
    runtime = Runtime.create(cfg, announce=Report().note)
    try:
        summary = evaluate(runtime, out_dir=out_dir, show_progress=cfg.log.progress)
    finally:
        runtime.close()
    check_reward_failures(summary)
    console.print(summary_table(f"eval: {cfg.model.name}", summary))
    print(json.dumps(summary))
    console.print(f"[dim]wrote {out_dir / 'eval_summary.json'} and eval_samples.jsonl[/dim]")
    return 0


def check_reward_failures(summary: dict[str, Any]) -> None:
    """A reward that failed on every sample makes the accuracy meaningless: one line, as in
    training, instead of a silent accuracy of 0."""
    samples = int(summary.get("samples", 0))
    for name, count in (summary.get("reward_failures") or {}).items():
        if samples and count >= samples:
            raise UpslopeError(f"reward '{name}' failed on every sample ({count} of {samples}); fix the reward "
                               f"function (failures on some samples get reward_fallback instead)")


def check_outputs(out_dir: Path, tag: str) -> None:
    """Refuse (one line) to overwrite an eval output file that upslope did not write: a file of
    the same name that is not an earlier evaluation's summary or samples."""
    summary, samples = out_dir / f"{tag}_summary.json", out_dir / f"{tag}_samples.jsonl"
    for path, keys in ((summary, {"accuracy", "tag"}), (samples, {"completion", "reward"})):
        if not path.exists():
            continue
        try:
            with open(path, "rb") as fh:
                head = fh.read() if path == summary else fh.readline()
            record = json.loads(head) if head.strip() else dict.fromkeys(keys)
        except (OSError, ValueError):
            record = None
        if path.is_dir() or not isinstance(record, dict) or not keys <= set(record):
            raise UpslopeError(f"{path}: exists and is not an earlier upslope evaluation's output; not overwriting "
                               f"it (choose another run_dir)")
