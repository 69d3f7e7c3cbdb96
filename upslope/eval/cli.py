"""`upslope eval` as a command: evaluate, print a table, write the JSON summary."""
from __future__ import annotations

import json
from pathlib import Path

from upslope.config import Config
from upslope.eval.runner import evaluate
from upslope.logs.progress import console, summary_table
from upslope.runtime import Runtime


def run_eval_command(cfg: Config) -> int:
    runtime = Runtime.create(cfg, announce=lambda m: console.print(f"[dim]{m}[/dim]"))
    try:
        out_dir = Path(cfg.run_dir)
        summary = evaluate(runtime, out_dir=out_dir, show_progress=cfg.log.progress)
    finally:
        runtime.close()
    console.print(summary_table(f"eval: {cfg.model.name}", summary))
    print(json.dumps(summary))
    console.print(f"[dim]wrote {out_dir / 'eval_summary.json'} and eval_samples.jsonl[/dim]")
    return 0
