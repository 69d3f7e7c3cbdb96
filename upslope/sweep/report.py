"""What a sweep hands back: a line per rung, the results table (rich), results.json and results.csv,
and best.yaml, a recipe of the best configuration for the recipe's own model."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Sequence

import yaml
from rich.table import Table

from upslope.config import apply_override
from upslope.sweep.spec import SweepSpec, yaml_value
from upslope.sweep.trial import Trial


def status(trial: Trial, rungs: Sequence[int], best: Trial | None) -> str:
    """best / finished / stopped after step S / failed at step S: error / pending."""
    if trial.error:
        failed = next((s for s, v in trial.scores.items() if v is None), "?")
        return f"failed at step {failed}: {trial.error}"
    if best is not None and trial.id == best.id:
        return "best"
    if trial.stopped:
        return f"stopped after step {trial.stopped}" + (f" ({trial.trend})" if trial.trend else "")
    return "finished" if trial.reached == rungs[-1] else "pending"


def rung_line(spec: SweepSpec, step: int, scores: dict[str, float | None], promoted: list[str]) -> str:
    """One line after a rung: each trial's metric, and who goes on."""
    parts = ", ".join(f"{t} {'failed' if v is None else f'{v:.4g}'}" for t, v in scores.items())
    go = f"; promoted: {', '.join(promoted)}" if promoted else ""
    return f"rung at step {step}: {spec.metric} {parts}{go}"


def print_table(spec: SweepSpec, rungs: Sequence[int], trials: Sequence[Trial], best: Trial | None) -> None:
    """The results table on stdout: a row per trial, its values, its metric at each rung, its status."""
    from upslope.logs.progress import notes

    table = Table(title=f"upslope sweep: {spec.metric} ({spec.goal}) at each rung", header_style="bold")
    table.add_column("trial")
    for key in spec.space:
        table.add_column(key)
    for step in rungs:
        table.add_column(f"step {step}", justify="right")
    table.add_column("status")
    for t in trials:
        cells = [yaml_value(t.point[k]) for k in spec.space]
        scores = ["-" if str(s) not in t.scores else "failed" if t.scores[str(s)] is None else f"{t.scores[str(s)]:.4g}"
                  for s in rungs]
        table.add_row(t.id, *cells, *scores, status(t, rungs, best))
    notes.print(table)


def results(spec: SweepSpec, rungs: Sequence[int], trials: Sequence[Trial], best: Trial, trained: int,
            ) -> dict[str, Any]:
    """The sweep's outcome as one mapping (results.json)."""
    return {"metric": spec.metric, "goal": spec.goal, "rungs": list(rungs), "eta": spec.eta,
            "recipe": spec.recipe, "command": spec.command, "proxy": spec.proxy,
            "best": {"trial": best.id, "point": best.point, "value": best.scores[str(rungs[-1])],
                     "checkpoint": str(Path(spec.out) / "trials" / best.id / "checkpoints" / f"step_{rungs[-1]:06d}")},
            "steps_trained": trained, "steps_without_early_stopping": len(trials) * rungs[-1],
            "trials": [{"trial": t.id, "point": t.point, "scores": t.scores, "status": status(t, rungs, best),
                        "seconds": round(t.seconds, 1)} for t in trials]}


def best_recipe(spec: SweepSpec, res: dict[str, Any], out: Path) -> str:
    """best.yaml: the recipe (as `base`), the sweep's overrides without the proxy model, the best point."""
    best = res["best"]
    data: dict[str, Any] = {}
    if spec.recipe:
        data["base"] = os.path.relpath(Path(spec.recipe).resolve(), out.resolve())
    for item in [*spec.overrides, *(f"{k}={yaml_value(v)}" for k, v in best["point"].items())]:
        apply_override(data, item)
    proxy = f", on the proxy model {spec.proxy}" if spec.proxy else ""
    head = (f"# upslope sweep: the best of {len(res['trials'])} trials by {spec.metric} ({spec.goal}): "
            f"{best['value']:.4g} at step {res['rungs'][-1]} (trial {best['trial']}{proxy}).\n"
            f"# Train it: upslope {spec.command} {out / 'best.yaml'}\n")
    return head + yaml.safe_dump(data, sort_keys=False)


def write(out: Path, spec: SweepSpec, rungs: Sequence[int], trials: Sequence[Trial], res: dict[str, Any]) -> None:
    """results.json, results.csv (a row per trial) and best.yaml in the sweep directory."""
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["trial", *spec.space, *(f"{spec.metric}@{s}" for s in rungs), "status", "seconds"])
        for row in res["trials"]:
            w.writerow([row["trial"], *(yaml_value(row["point"][k]) for k in spec.space),
                        *("" if row["scores"].get(str(s)) is None else row["scores"][str(s)] for s in rungs),
                        row["status"], row["seconds"]])
    (out / "best.yaml").write_text(best_recipe(spec, res, out))


def summary_line(out: Path, res: dict[str, Any]) -> str:
    best = res["best"]
    point = ", ".join(f"{k}={yaml_value(v)}" for k, v in best["point"].items())
    return (f"best: {best['trial']} ({point}) {res['metric']} {best['value']:.4g}; trained "
            f"{res['steps_trained']} steps of the {res['steps_without_early_stopping']} that every trial to step "
            f"{res['rungs'][-1]} would take; wrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'best.yaml'}")
