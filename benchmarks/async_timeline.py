"""The timeline PNG of one pipeline run (dist.rollout_workers > 0): who was busy when, from the run's
timeline.jsonl (workers' jobs, the learner's update and its wait for rollouts, weight pushes).

    PYTHONPATH=$PWD python benchmarks/async_timeline.py RUN_DIR [--out RUN_DIR/timeline.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from upslope.logs.plot import plot_timeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    events = [json.loads(x) for x in (args.run_dir / "timeline.jsonl").read_text().splitlines()]
    out = plot_timeline(events, args.out or args.run_dir / "timeline.png", title=str(args.run_dir))
    print(out)


if __name__ == "__main__":
    main()
