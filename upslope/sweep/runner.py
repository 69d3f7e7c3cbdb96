"""Running a sweep: each trial an `upslope COMMAND` run in its own directory (OUT/trials/tNNN), every
rung continuing the trial from its own checkpoint with more steps (train.resume=latest,
train.stop_after), the sweep's state saved to OUT/sweep.json after every trial-rung so that a killed
sweep continues where it stopped, with the same decisions."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from upslope import checkpoint as ckpt
from upslope.errors import ConfigError, UpslopeError, one_line
from upslope.sweep import report
from upslope.sweep.check import base_overrides, check_space, lookup, metric_missing, point_overrides, trial_config
from upslope.sweep.halving import promoted, ranked, rung_sizes, sample_points, steps_trained, trend_verdict
from upslope.sweep.spec import SweepSpec, yaml_value
from upslope.sweep.trial import Trial

STATE = "sweep.json"


def read_metric(path: Path, key: str, step: int) -> tuple[float | None, list[str]]:
    """(value of `key` at `step` in a metrics.jsonl, every key logged up to there). An evaluation metric
    must be logged at `step` itself; a training metric is its last value at or before `step`."""
    points, logged = read_series(path, key, step)
    if key.startswith("eval/"):
        points = [(at, value) for at, value in points if at == step]
    return (points[-1][1] if points else None), logged


def read_series(path: Path, key: str, step: int) -> tuple[list[tuple[int, float]], list[str]]:
    """((step, value) of every record of `key` up to `step` in a metrics.jsonl, every key logged up to there)."""
    points: list[tuple[int, float]] = []
    logged: set[str] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if int(rec.get("step", 0)) > step:
                continue
            logged.update(k for k in rec if k != "step")
            if isinstance(rec.get(key), (int, float)):
                points.append((int(rec["step"]), float(rec[key])))
    return points, sorted(logged)


def checkpoint_step(run_dir: Path) -> int:
    """The step of a trial's latest complete checkpoint (0: none)."""
    try:
        return int(ckpt.find_checkpoint(run_dir, "latest").name.removeprefix("step_"))
    except (UpslopeError, ValueError):
        return 0


class Sweep:
    """A successive-halving sweep over `spec.space`, its state in OUT/sweep.json."""

    def __init__(self, spec: SweepSpec, say: Callable[[str], None] = print):
        self.spec, self.say = spec, say
        self.out = Path(spec.out)
        base = check_space(spec)
        if spec.executor == "inprocess":
            from upslope.rollout.engines import engine_name

            if engine_name(base.engine) == "vllm":
                raise ConfigError("upslope sweep --executor inprocess: the trials' engine is vllm, which hosts one "
                                  "engine per process; use --executor subprocess or engine.name=hf")
        self.rungs = spec.rungs or [base.train.steps]
        self.evaluates = spec.metric.startswith("eval/")
        self.trials = self.load_or_start()

    # ------------------------------------------------------------------ state

    def load_or_start(self) -> list[Trial]:
        path = self.out / STATE
        if path.exists():
            state = json.loads(path.read_text())
            if state["spec"] != self.spec.identity():
                diff = next(k for k in self.spec.identity() if state["spec"].get(k) != self.spec.identity()[k])
                raise ConfigError(f"upslope sweep: {path} holds another sweep ({diff}: {state['spec'].get(diff)!r} "
                                  f"there, {self.spec.identity()[diff]!r} now); continue it with its settings or "
                                  f"choose another --out")
            self.say(f"continuing the sweep in {self.out} ({sum(len(t['scores']) for t in state['trials'])} "
                     f"trial-rungs done)")
            return [Trial(**t) for t in state["trials"]]
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"upslope sweep --out {self.out}: cannot create it ({exc.strerror})") from None
        if any(self.out.iterdir()):
            raise ConfigError(f"upslope sweep --out {self.out}: not empty and holds no sweep; choose another --out")
        trials = []
        for i, point in enumerate(sample_points(self.spec.space, self.spec.budget, self.spec.seed)):
            try:  # the values the config resolves (1e-6 given as text becomes the float it is)
                cfg = trial_config(self.spec, point)
            except ConfigError as exc:
                raise ConfigError(f"upslope sweep: trial t{i:03d} ({shown(point)}): {exc}") from None
            trials.append(Trial(f"t{i:03d}", {k: lookup(cfg, k) for k in point}))
        self.trials = trials
        self.save()
        return trials

    def save(self) -> None:
        """The state, written whole and renamed into place (a kill never leaves half a file)."""
        tmp = self.out / f".{STATE}.tmp"
        tmp.write_text(json.dumps({"spec": self.spec.identity(), "rungs": self.rungs,
                                   "trials": [asdict(t) for t in self.trials]}, indent=1))
        os.replace(tmp, self.out / STATE)

    # ------------------------------------------------------------------ the sweep

    def run(self) -> dict[str, Any]:
        """Every rung in turn: run its trials that have no score there yet, promote the best 1/eta,
        stop the rest; then the results files and the best config. Returns the results."""
        by_id = {t.id: t for t in self.trials}
        alive = [t.id for t in self.trials]
        sizes = rung_sizes(len(alive), self.spec.eta, len(self.rungs))
        for r, step in enumerate(self.rungs):
            for tid in alive:
                trial = by_id[tid]
                if str(step) not in trial.scores and trial.error is None:
                    self.run_rung(trial, r)
            scores = {tid: by_id[tid].scores.get(str(step)) for tid in alive}
            if not ranked(scores, self.spec.goal):
                first = next((by_id[t].error for t in alive if by_id[t].error), "no score")
                raise UpslopeError(f"upslope sweep: every trial at step {step} failed; the first: {first}")
            if r + 1 < len(self.rungs):
                nxt = self.by_trend(promoted(scores, sizes[r + 1], self.spec.goal), by_id, step)
                for tid in alive:
                    if tid not in nxt:
                        self.stop(by_id[tid], step)
                alive = nxt
            self.save()
            self.say(report.rung_line(self.spec, step, scores, alive if r + 1 < len(self.rungs) else []))
        best = by_id[ranked({t: by_id[t].scores.get(str(self.rungs[-1])) for t in alive}, self.spec.goal)[0]]
        return self.finish(best)

    def by_trend(self, chosen: list[str], by_id: dict[str, Trial], step: int) -> list[str]:
        """The promoted trials less those whose `trend_metric` is flat or collapsing at `step` (each one's
        reason recorded); when that leaves none, the best by the rung metric goes on alone."""
        spec = self.spec
        if not spec.trend_metric:
            return chosen
        keep = []
        for tid in chosen:
            path = self.out / "trials" / tid / "metrics.jsonl"
            points, logged = read_series(path, spec.trend_metric, step)
            if not points:
                raise metric_missing(spec.trend_metric, logged, tid, step, "trend_metric")
            by_id[tid].trend = trend_verdict(points, window=spec.trend_window, min_slope=spec.trend_min_slope,
                                             drop=spec.trend_drop, goal=spec.trend_goal)
            if by_id[tid].trend is None:
                keep.append(tid)
        if not keep:
            best = ranked({t: by_id[t].scores.get(str(step)) for t in chosen}, spec.goal)[0]
            by_id[best].trend, keep = None, [best]
        for tid in chosen:
            if by_id[tid].trend:
                self.say(f"{tid}: {spec.trend_metric} {by_id[tid].trend}; not promoted")
        return keep

    def stop(self, trial: Trial, step: int) -> None:
        """Not promoted after `step`: its checkpoints go unless --keep-checkpoints (its metrics stay)."""
        trial.stopped = trial.stopped or step
        if not self.spec.keep_checkpoints:
            shutil.rmtree(self.out / "trials" / trial.id / "checkpoints", ignore_errors=True)

    def run_rung(self, trial: Trial, r: int) -> None:
        """Train `trial` to rung r's step from its latest checkpoint (a first rung from scratch), read the
        metric there, record it and save the state."""
        step, run_dir = self.rungs[r], self.out / "trials" / trial.id
        done = checkpoint_step(run_dir)
        value, logged = read_metric(run_dir / "metrics.jsonl", self.spec.metric, step)
        t0 = time.perf_counter()
        if done < step or (value is None and done == step == self.rungs[-1] and self.evaluates):
            if done == 0:  # a first run killed before its checkpoint: its files are the sweep's own, start over
                shutil.rmtree(run_dir, ignore_errors=True)
            self.say(f"{trial.id} ({shown(trial.point)}): steps {done} -> {step}"
                     + (" (from its checkpoint)" if done else ""))
            error = self.execute(self.trial_args(trial, run_dir, done, step), run_dir / "trial.log")
            if error is not None:
                trial.error, trial.scores[str(step)] = error, None
                trial.seconds += time.perf_counter() - t0
                self.save()
                self.say(f"{trial.id} failed: {error}")
                return
            value, logged = read_metric(run_dir / "metrics.jsonl", self.spec.metric, step)
        if value is None:
            raise metric_missing(self.spec.metric, logged, trial.id, step)
        trial.scores[str(step)] = value
        trial.seconds += time.perf_counter() - t0
        self.save()

    def trial_args(self, trial: Trial, run_dir: Path, done: int, step: int) -> list[str]:
        """The overrides of one trial-rung: the sweep's, the point's, then the run directory, the full
        length (every rung is a prefix of one train.steps run, so the schedule is the same) and the stop."""
        args = [*base_overrides(self.spec), *point_overrides(trial.point), f"run_dir={run_dir}",
                f"train.steps={self.rungs[-1]}", f"train.stop_after={max(step - done, 1)}", "train.save_every=0",
                f"train.eval_at={yaml_value(self.rungs[:-1] if self.evaluates else [])}", "train.eval_every=0",
                "train.eval_before=false", f"train.eval_after={yaml_value(self.evaluates)}", "log.progress=false",
                "log.plot=false"]
        return args + (["train.resume=latest"] if done else [])

    def execute(self, args: list[str], log: Path) -> str | None:
        """Run one trial-rung; None when it finished, else its error line."""
        log.parent.mkdir(parents=True, exist_ok=True)
        recipe = [self.spec.recipe] if self.spec.recipe else []
        if self.spec.executor == "inprocess":
            return run_inprocess(self.spec.command, self.spec.recipe, args)
        cmd = [sys.executable, "-m", "upslope.cli", self.spec.command, *recipe, *args]
        with open(log, "a") as fh:
            fh.write(f"$ {shlex.join(cmd)}\n")
            fh.flush()
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
        if proc.returncode == 0:
            return None
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith("upslope: error:")]
        return (errors or lines or [f"exit code {proc.returncode}"])[-1].removeprefix("upslope: error: ")

    def finish(self, best: Trial) -> dict[str, Any]:
        """results.json, results.csv, best.yaml, and the table."""
        results = report.results(self.spec, self.rungs, self.trials, best,
                                 steps_trained(self.rungs, [self.rungs.index(t.reached) if t.reached else -1
                                                            for t in self.trials]))
        report.write(self.out, self.spec, self.rungs, self.trials, results)
        report.print_table(self.spec, self.rungs, self.trials, best)
        self.say(report.summary_line(self.out, results))
        return results


def run_inprocess(command: str, recipe: str | None, args: list[str]) -> str | None:
    """A trial-rung in this process (what `upslope COMMAND` does, without its start-up); its error line or None."""
    from upslope.config import load_config
    from upslope.fsutil import check_run_dir
    from upslope.launch import run_trainer

    try:
        cfg = load_config(recipe, args)
        check_run_dir(Path(cfg.run_dir), resuming=bool(cfg.train.resume))
        run_trainer(command, cfg)
    except UpslopeError as exc:
        return one_line(str(exc))
    return None


def shown(point: dict[str, Any]) -> str:
    """A point as `key=value, ...`."""
    return ", ".join(f"{k}={yaml_value(v)}" for k, v in point.items())
