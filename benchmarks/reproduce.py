"""Miniature reproduction of a seed method's claimed direction: its recipe against its stated
baseline on the same task, several seeds each, with a 95% interval on the difference.

    python benchmarks/reproduce.py METHOD [--steps 60] [--seeds 3] [--jobs 1] [--dry-run] [--set key=value ...]
    python benchmarks/reproduce.py METHOD ... --task T1 --task T2 --dry-run   # the distinct runs several rows need
    python benchmarks/reproduce.py --render          # regenerate docs/reproductions.md from the JSON rows

Arms are interleaved (seed 0: method, baseline; seed 1: ...), `--jobs N` of them at a time (each a process
of its own: one per core with `--set=train.threads=1`; each arm records its own CPU time), and an arm's seed S runs with
`train.seed=S engine.seed=S`, so both arms see the same prompts per seed. Each arm is one
`upslope train` (or the claim's `command`, e.g. `distill`; a distillation claim first trains its
teacher recipe once, seed 0, and gives both arms that run as `distill.teacher`; a claim's
`baseline_command` runs its baseline arm when that differs, e.g. `randopt` against `train`; a search claim first runs `upslope sweep` over its recipe, seed 0, and its
method arm trains the sweep's best.yaml). A metric is read
from each run's metrics.jsonl: `KEY` is its last record holding KEY (e.g. the final eval/accuracy),
`mean:KEY` the mean over every record holding it (a step metric over the run, e.g. mean:mismatch).
A claim's further metrics (`also`, e.g. accuracy beside a calibration error) get the same interval
and verdict. The interval is Welch's t interval (unequal variances, Welch-Satterthwaite degrees of
freedom). Verdict: reproduced when the interval excludes 0 in the claimed direction, not reproduced
when it excludes 0 in the opposite one, inconclusive when it contains 0. Each row is appended to
docs/results/reproductions.json with its command, the CPU time of its runs, the CPU model and `code`, the version
stamp of upslope, recipes and pyproject.toml the runs were made with (see git_head). A finished arm
whose command and commit are unchanged is reused (so one baseline run serves every method's
row; `--fresh` reruns), and each run's final checkpoint is deleted once its metric is read (a
teacher's is kept). Every finished arm is also recorded in the arm ledger (`--arms`, by default beside
`--rows`: its command without interpreter and run directory, the code stamp, its metrics, CPU time and CPU model), and
an arm whose command and code stamp the ledger already holds is taken from it instead of run: a row can
reuse baselines measured in another work directory, clone or session at the same code (a worktree checked
out at the ledger's commit), while a changed package, recipe or command runs afresh.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "docs" / "results" / "reproductions.json"
NOTES = ROOT / "docs" / "results" / "reproductions_notes.md"
DOC = ROOT / "docs" / "reproductions.md"
RUN_FLAGS = ("log.progress=false", "log.tensorboard=false", "log.plot=false", "train.eval_every=0",
             "train.eval_before=false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_claims import METHODS, Claim  # noqa: E402  (what each method claims: benchmarks/reproduce_claims.py)
from reproduce_tasks import TASKS, check_portable, task_overrides  # noqa: E402  (external tasks)
from reproduce_page import PLOT, plot_rows, render  # noqa: E402  (the generated page: benchmarks/reproduce_page.py)


# ---------------------------------------------------------------- statistics


def t_quantile(p: float, df: float) -> float:
    """The p-quantile (p > 0.5) of Student's t with `df` degrees of freedom, by bisection on its
    CDF (Simpson's rule on the density: the standard library has no t distribution)."""
    def cdf(x: float) -> float:
        c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
        n = 2000
        h = x / n
        dens = [math.exp(c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(n + 1)]
        return 0.5 + h / 3 * (dens[0] + dens[-1] + 4 * sum(dens[1:-1:2]) + 2 * sum(dens[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's t interval on the difference of means (each arm >= 2 values)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("each arm needs at least 2 seeds for an interval")
    diff = statistics.mean(a) - statistics.mean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return diff, diff - half, diff + half


def verdict(low: float, high: float, direction: str) -> str:
    """reproduced / not reproduced / inconclusive: the interval excludes 0 in the claimed
    direction / in the opposite direction / contains 0."""
    if direction not in ("higher", "lower"):
        raise ValueError(f"direction must be 'higher' or 'lower', not {direction!r}")
    above, below = low > 0, high < 0
    if not (above or below):
        return "inconclusive"
    return "reproduced" if above == (direction == "higher") else "not reproduced"


def comparison(values: dict[str, list[float]], direction: str) -> dict[str, Any]:
    """Per-arm values, mean and sd, the difference (method - baseline) with its Welch interval, and the verdict."""
    diff, low, high = welch_interval(values["method"], values["baseline"])
    arms = {arm: {"values": v, "mean": statistics.mean(v), "sd": statistics.stdev(v)} for arm, v in values.items()}
    return {"arms": arms, "diff": diff, "ci95": [low, high], "verdict": verdict(low, high, direction)}


def row_for(method: str, claim: Claim, values: dict[str, dict[str, list[float]]], *, steps: int, seeds: list[int],
            command: str, cpu_s: float) -> dict[str, Any]:
    """The reproduction row of one method from its per-seed values of each claimed metric
    ({metric: {"method": [...], "baseline": [...]}}); `also` holds the further metrics' comparisons."""
    main = comparison(values[claim.metric], claim.direction)
    also = [{"metric": m, "direction": d, **comparison(values[m], d)} for m, d in claim.also]
    return {"method": method, "recipe": claim.recipe, "baseline": claim.baseline, "metric": claim.metric,
            "direction": claim.direction, "paper": claim.paper, "steps": steps, "seeds": seeds, **main,
            "interval": "Welch t, 95%", "also": also, "command": command, "cpu_s": round(cpu_s, 1),
            "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


# ---------------------------------------------------------------- runs


def recipe_path(recipe: str) -> str:
    """A recipe's file: a name from recipes/, or a path to a YAML file (a sweep's best.yaml)."""
    return recipe if recipe.endswith(".yaml") else str(ROOT / "recipes" / f"{recipe}.yaml")


def arm_command(recipe: str, seed: int, steps: int, run_dir: Path, extra: Sequence[str],
                command: str = "train") -> list[str]:
    """`upslope COMMAND` (train, distill, randopt) of one arm at one seed (the same prompts per seed in both arms)."""
    return [sys.executable, "-m", "upslope.cli", command, recipe_path(recipe),
            f"train.seed={seed}", f"engine.seed={seed}", f"train.steps={steps}", f"run_dir={run_dir}",
            *RUN_FLAGS, *extra]


def final_metric(metrics_file: Path, key: str) -> float:
    """`key` from a run's metrics.jsonl: its value in the last record holding it, or with a `mean:`
    prefix the mean over every record holding the rest (a step metric over the whole run)."""
    reduce_mean = key.startswith("mean:")
    name = key.removeprefix("mean:")
    rows = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip()]
    found = [float(r[name]) for r in rows if name in r]
    if not found:
        raise KeyError(f"{metrics_file}: no record holds '{name}'")
    return statistics.mean(found) if reduce_mean else found[-1]


def cpu_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), recorded beside CPU times, which depend on it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


RUN_INPUTS = ("upslope", "recipes", "pyproject.toml")  # what a run's result depends on (docs do not)


def git_head() -> str:
    """The version of the code the runs are made with: git's hash of RUN_INPUTS at HEAD (with '+dirty' when
    they have uncommitted changes), part of a run's stamp. A commit that touches only docs or results keeps
    it, so the shared baselines stay reusable while rows are written up."""
    try:
        tree = subprocess.run(["git", "-C", str(ROOT), "rev-parse", *(f"HEAD:{p}" for p in RUN_INPUTS)],
                              capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                                *RUN_INPUTS], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    if tree.returncode != 0:
        return "unknown"
    return hashlib.sha1(tree.stdout.encode()).hexdigest()[:16] + ("+dirty" if dirty.strip() else "")


@contextlib.contextmanager
def locked(path: Path):
    """Hold an exclusive lock on `path` (created if missing): reproductions run side by side wait for
    each other's shared runs instead of clearing a directory another process is writing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ledger_args(cmd: Sequence[str]) -> list[str]:
    """An arm's command as the ledger keys it: without the interpreter and the run directory, and a recipe of
    this checkout named relative to it, so the same run made from another clone or work directory matches."""
    out = []
    for arg in cmd[1:]:
        if arg.startswith("run_dir="):
            continue
        path = Path(arg)
        out.append(str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT / "recipes")
                   else arg)
    return out


def recorded(ledger: Path, cmd: Sequence[str], metrics: Sequence[str]) -> dict[str, float] | None:
    """The metrics of `cmd` at this code stamp from the arm ledger, or None when it holds no such arm (or
    lacks one of `metrics`)."""
    key, code = ledger_args(cmd), git_head()
    for rec in reversed(load_rows(ledger)):
        if rec["args"] == key and rec["code"] == code and all(m in rec["metrics"] for m in metrics):
            return {m: rec["metrics"][m] for m in metrics}
    return None


def recorded_cpu_s(ledger: Path, cmd: Sequence[str]) -> float:
    """The CPU seconds the ledger records for `cmd` at this code stamp (0 when it holds no such arm)."""
    key, code = ledger_args(cmd), git_head()
    for rec in reversed(load_rows(ledger)):
        if rec["args"] == key and rec["code"] == code:
            return float(rec.get("cpu_s", 0.0))
    return 0.0


def record(ledger: Path, cmd: Sequence[str], got: dict[str, float], cpu_s: float) -> None:
    """Append a finished arm to the ledger."""
    append_row(ledger, {"args": ledger_args(cmd), "code": git_head(), "metrics": got, "cpu_s": round(cpu_s, 1),
                        "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


def run_arm(cmd: list[str], run_dir: Path, metrics: Sequence[str], fresh: bool = False,
            keep_checkpoints: bool = False, ledger: Path | None = None) -> tuple[dict[str, float], bool]:
    """({metric: value}, reused): a finished run of the identical command at the same commit in `run_dir`
    is reused (baselines are shared by every method's row), then one the `ledger` records; otherwise the
    directory is cleared, the arm runs and the ledger records it. The final checkpoint is deleted
    afterwards (metrics and evaluation samples stay) unless `keep_checkpoints` (a distillation teacher,
    whose checkpoint the ledger cannot give back). A second process asking for the same directory waits
    for the first and then reuses its run."""
    with locked(run_dir.parent / f".{run_dir.name}.lock"):
        return _run_arm_unlocked(cmd, run_dir, metrics, fresh, keep_checkpoints, ledger)


def run_stamp(cmd: Sequence[str]) -> dict[str, Any]:
    """What a finished run's directory is stamped with: its command without the interpreter, and the code."""
    return {"args": list(cmd[1:]), "commit": git_head()}


def finished_run(cmd: Sequence[str], run_dir: Path, metrics: Sequence[str], ledger: Path | None,
                 keep_checkpoints: bool = False) -> dict[str, float] | None:
    """The metrics of a finished identical run of `cmd` at this code: from `run_dir` when the run stamped it
    (and, for a teacher, its checkpoint is still there), else from the `ledger`; None when neither has one."""
    stamp_file = run_dir / "reproduce_stamp.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == run_stamp(cmd):
        try:
            if not keep_checkpoints or (run_dir / "checkpoints").is_dir():
                return {m: final_metric(run_dir / "metrics.jsonl", m) for m in metrics}
        except (KeyError, OSError):
            pass
    if ledger is not None and not keep_checkpoints:
        return recorded(ledger, cmd, metrics)
    return None


def _run_arm_unlocked(cmd: list[str], run_dir: Path, metrics: Sequence[str], fresh: bool,
                      keep_checkpoints: bool, ledger: Path | None) -> tuple[dict[str, float], bool]:
    if not fresh:
        got = finished_run(cmd, run_dir, metrics, ledger, keep_checkpoints)
        if got is not None:
            return got, True
    shutil.rmtree(run_dir, ignore_errors=True)
    returncode, stderr, cpu_s = run_measured(cmd)
    if returncode != 0:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"the run in {run_dir} failed: {tail}")
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    (run_dir / "reproduce_stamp.json").write_text(json.dumps(run_stamp(cmd)))
    got = {m: final_metric(run_dir / "metrics.jsonl", m) for m in metrics}
    if ledger is not None:
        record(ledger, cmd, got, cpu_s)
    return got, False


def run_measured(cmd: Sequence[str]) -> tuple[int, str, float]:
    """(exit code, stderr, CPU seconds) of `cmd`: the CPU time (user + system) of that process and the children
    it waited for, read from its own rusage, so arms running side by side each record only their own."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=err)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: the run does not outlive its reproduction
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read().decode(errors="replace"), usage.ru_utime + usage.ru_stime


def run_arms(planned: Sequence[tuple[int, str, Path, list[str]]], label: str, keys: Sequence[str], fresh: bool,
             ledger: Path | None, jobs: int) -> list[tuple[dict[str, float], bool]]:
    """Run the planned arms ((seed, arm, run dir, command), in the interleaved order), `jobs` at a time, each a
    process of its own; say each as it finishes; their ({metric: value}, reused) in the planned order. Arms
    asking for one shared run make it once (run_arm); when one fails, the arms not yet started are dropped and
    those running are let finish (the ledger keeps them) before the failure is raised."""
    failed = threading.Event()  # set by the arm that failed, before its worker takes the next

    def one(seed: int, arm: str, run_dir: Path, cmd: list[str]) -> tuple[dict[str, float], bool] | None:
        if failed.is_set():
            return None  # dropped: an earlier arm failed
        try:
            got, again = run_arm(cmd, run_dir, keys, fresh, ledger=ledger)
        except BaseException:
            failed.set()
            raise
        shown = ", ".join(f"{m} = {got[m]:.4f}" for m in keys)
        print(f"{label} {arm} seed {seed}: {shown}{' (reused)' if again else ''}", flush=True)
        return got, again

    if jobs == 1:
        return [one(*item) for item in planned]
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # leaving it waits for the arms still running
        futures = [pool.submit(one, *item) for item in planned]
        return [f.result() for f in futures]  # the first failure, in the planned order, is raised here


def run_sweep(claim: Claim, steps: int, sweep_dir: Path, extra: Sequence[str], fresh: bool = False,
              plan: Plan | None = None) -> tuple[dict[str, Any], bool]:
    """Run (or reuse, like an arm) a search claim's `upslope sweep` over its recipe; (its summary, reused). The
    summary's `recipe` is a copy of best.yaml named by its content, so a changed best point is a new arm. With
    a dry run's `plan`, only list the sweep there."""
    flags = [f.format(steps=steps, first_rung=max(1, steps // 3)) for f in claim.sweep]
    cmd = [sys.executable, "-m", "upslope.cli", "sweep", recipe_path(claim.recipe), *flags, "--out", str(sweep_dir),
           "log.tensorboard=false", *extra]
    stamp_file, stamp = sweep_dir.parent / f"{sweep_dir.name}.stamp.json", {"args": cmd[1:], "commit": git_head()}

    def finished() -> bool:
        return not fresh and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp and \
            (sweep_dir / "results.json").exists()

    if plan is not None:
        again = finished()
        plan.add(cmd, again)
        return {"recipe": str(best_copy(sweep_dir) if again else sweep_dir / "best.yaml")}, again
    with locked(sweep_dir.parent / f".{sweep_dir.name}.lock"):
        again = finished()
        if not again:
            shutil.rmtree(sweep_dir, ignore_errors=True)
            stamp_file.unlink(missing_ok=True)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
                raise SystemExit(f"the sweep in {sweep_dir} failed: {tail}")
            stamp_file.write_text(json.dumps(stamp))
    res = json.loads((sweep_dir / "results.json").read_text())
    copy = best_copy(sweep_dir)
    copy.write_text((sweep_dir / "best.yaml").read_text())
    return {"recipe": str(copy), "point": res["best"]["point"], "value": res["best"]["value"],
            "steps_trained": res["steps_trained"], "steps_without_early_stopping": res["steps_without_early_stopping"],
            "trials": len(res["trials"])}, again


def best_copy(sweep_dir: Path) -> Path:
    """Where a finished sweep's best.yaml is copied, named by its content."""
    return sweep_dir / f"best-{hashlib.sha1((sweep_dir / 'best.yaml').read_bytes()).hexdigest()[:10]}.yaml"


class Plan:
    """What a dry run lists, over one or more rows: each run's command, commented out when a finished identical
    run serves it (`# taken: ...`) or a row listed earlier already makes it (`# planned above: ...`, e.g. a
    baseline two rows share), so the lines piped to a shell make each run still to make once."""

    def __init__(self) -> None:
        self.to_make: set[tuple[str, ...]] = set()  # the runs to make, as the ledger keys them
        self.counts = {"planned": 0, "taken": 0, "shared": 0}

    def add(self, cmd: Sequence[str], finished: bool) -> None:
        """List one run of the current row."""
        key = tuple(ledger_args(cmd))
        shared = not finished and key in self.to_make
        if not finished:
            self.to_make.add(key)
        print(("# taken: " if finished else "# planned above: " if shared else "") + shlex.join(cmd))
        self.counts["planned"] += 1
        self.counts["taken"] += finished
        self.counts["shared"] += shared

    def close_row(self, label: str) -> None:
        """Say how many of the row's runs are still to make, and start counting the next row."""
        c = self.counts
        print(f"{label}: {c['planned'] - c['taken'] - c['shared']} of {c['planned']} runs to make, {c['taken']} "
              "taken from the ledger or their run directories"
              + (f", {c['shared']} planned by a row above" if c["shared"] else ""), file=sys.stderr)
        self.counts = dict.fromkeys(c, 0)


def arm_dir(work: Path, method: str, arm: str, recipe: str, steps: int, overrides: Sequence[str], seed: int) -> Path:
    """A method arm's run directory; a baseline's is keyed by recipe, steps and overrides, so rows share it."""
    if arm == "method":
        return work / method / arm / f"seed{seed}"
    return work / "baselines" / f"{recipe}-{stamp_key(steps, list(overrides))}" / f"seed{seed}"


def stamp_key(*parts: Any) -> str:
    """A short hash naming a shared run directory by what its runs depend on."""
    return hashlib.sha1(json.dumps(list(parts)).encode()).hexdigest()[:10]


def reproduce(method: str, steps: int, seeds: list[int], work: Path, extra: Sequence[str],
              plan: Plan | None = None, fresh: bool = False, task: str | None = None,
              ledger: Path | None = None, jobs: int = 1) -> dict[str, Any] | None:
    """Run both arms interleaved over `seeds`, `jobs` at a time (after the teacher, for a distillation claim), on
    `task` (an external task of reproduce_tasks.TASKS; None: the recipes' own), taking arms the `ledger` records at this
    code; the row (None for a dry run, which lists the runs in `plan` instead, and says how many are still to
    make; and for one seed: a part of a row split over processes, whose arms the ledger and the
    run directories keep for the row's own run)."""
    claim = METHODS[method]
    arms = {"method": claim.recipe, "baseline": claim.baseline}
    on_task: list[str] = []
    if task is not None:
        check_portable(method, claim.recipe, claim.baseline, task, claim.command)
        on_task, work = task_overrides(task), work / task
    user_extra, extra = list(extra), [*on_task, *extra]  # extra: what the teacher, the sweep and both arms run with
    overrides = [*claim.overrides, *extra]
    keys = [m for m, _ in claim.metrics()]
    values: dict[str, dict[str, list[float]]] = {m: {arm: [] for arm in arms} for m in keys}
    reused = 0
    teacher: dict[str, Any] = {}
    cpu0 = children_cpu_s()
    if claim.teacher:  # trained once (seed 0) with the user's overrides; its run directory teaches both arms
        teacher_dir = work / "teachers" / f"{claim.teacher}-{stamp_key(steps, list(extra))}"
        cmd = arm_command(claim.teacher, 0, steps, teacher_dir, extra)
        if plan is not None:
            plan.add(cmd, not fresh and finished_run(cmd, teacher_dir, ["eval/accuracy"], None, True) is not None)
        else:
            got, again = run_arm(cmd, teacher_dir, ["eval/accuracy"], fresh, keep_checkpoints=True)
            teacher = {"recipe": claim.teacher, "run_dir": str(teacher_dir), **got}
            reused += again
        overrides.append(f"distill.teacher={teacher_dir}")
    search: dict[str, Any] = {}
    if claim.sweep:  # searched once (seed 0) with the user's overrides; the method arm trains its best point
        search, again = run_sweep(claim, steps, work / "sweeps" / f"{method}-{stamp_key(steps, list(extra))}",
                                  extra, fresh, plan)
        reused += again
        arms["method"] = search["recipe"]
    planned = []
    for seed in seeds:
        for arm, recipe in arms.items():
            run_dir = arm_dir(work, method, arm, recipe, steps, overrides, seed)
            own = [o.format(steps=steps, half=max(1, steps // 2)) for o in claim.scaled] if arm == "method" else []
            planned.append((seed, arm, run_dir, arm_command(recipe, seed, steps, run_dir, [*overrides, *own],
                                                            claim.command_of(arm))))
    if plan is not None:
        for _, _, run_dir, cmd in planned:
            plan.add(cmd, not fresh and finished_run(cmd, run_dir, keys, ledger) is not None)
        plan.close_row(method + (f" on {task}" if task else ""))
        return None
    taken_cpu_s = 0.0  # method arms run earlier (a `--seeds 1` part makes no row): the ledger's CPU for them
    for (_, arm, _, cmd), (got, again) in zip(planned, run_arms(planned, method, keys, fresh, ledger, jobs)):
        for m in keys:
            values[m][arm].append(got[m])
        reused += again
        if again and arm == "method" and ledger is not None:
            taken_cpu_s += recorded_cpu_s(ledger, cmd)
    if len(seeds) < 2:
        print(f"{method}: seed {seeds[0]} recorded for the row's own run; one seed makes no row (no interval)")
        return None
    command = shlex.join(["python", "benchmarks/reproduce.py", method, "--steps", str(steps),
                          "--seeds", str(len(seeds)), *(["--first-seed", str(seeds[0])] if seeds[0] else []),
                          *(["--task", task] if task else []),
                          *[f"--set={x}" for x in user_extra]])
    row = row_for(method, claim, values, steps=steps, seeds=seeds, command=command,
                  cpu_s=children_cpu_s() - cpu0 + taken_cpu_s)
    if task is not None:
        row["task"] = task
    row["reused_runs"] = reused  # the method arms' CPU counts here; a shared baseline's in the row that ran it
    row["code"] = git_head()  # the version of upslope, recipes and pyproject the runs were made with
    if teacher:
        row["teacher"] = teacher
    if search:
        row["sweep"] = search
    if claim.scaled:
        row["method_overrides"] = [o.format(steps=steps, half=max(1, steps // 2)) for o in claim.scaled]
    return row


def load_rows(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append `row` to the JSON list in `path` (created if missing); processes finishing side by side take turns."""
    with locked(path.with_name(f".{path.name}.lock")):
        path.write_text(json.dumps([*load_rows(path), row], indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("methods", nargs="*", metavar="METHOD", help="the methods to reproduce, a row each (one of: "
                    + ", ".join(sorted(METHODS)) + ")")
    ap.add_argument("--steps", type=int, default=60, help="training steps per run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per arm (FIRST..FIRST+N-1); 1: a part of a row, "
                    "its arms run and recorded, no row")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (another process running the later "
                    "seeds of a row into the same --work lets the row's own run reuse them: a row split over cores)")
    ap.add_argument("--jobs", type=int, default=1, help="arms run at once, each a process of its own (with "
                    "--set=train.threads=1, one per core uses a machine's cores; the row is the same)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing (those a finished "
                    "identical run serves or a row above makes commented out) and how many runs are still to make")
    ap.add_argument("--fresh", action="store_true", help="rerun every arm (default: reuse a finished identical run)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override passed to both arms")
    ap.add_argument("--task", action="append", choices=sorted(TASKS), help="run both arms on this external task "
                    "(default: the recipes' own); its task, reward, reply length and evaluation replace the "
                    "recipes'; given more than once, a row for each")
    ap.add_argument("--work", default="/tmp/upslope-reproduce", help="run directories go here")
    ap.add_argument("--rows", default=str(ROWS), help="JSON file the row is appended to")
    ap.add_argument("--arms", help="the arm ledger: finished arms are recorded here and taken from it at the same "
                    "code (default: ROWS_arms.json beside --rows)")
    ap.add_argument("--doc", default=str(DOC), help="the page --render writes")
    ap.add_argument("--render", action="store_true", help="write --doc from --rows (and the notes), run nothing")
    a = ap.parse_args(argv)
    rows_path = Path(a.rows)
    if a.render:
        rows, doc = load_rows(rows_path), Path(a.doc)
        drawn = plot_rows(rows, doc.parent / PLOT)
        doc.write_text(render(rows, NOTES.read_text() if NOTES.exists() else "", plot=bool(drawn)))
        print(f"wrote {a.doc}" + (f" and {doc.parent / PLOT}" if drawn else ""))
        return 0
    if not a.methods:
        ap.error("name a METHOD (or --render)")
    unknown = [m for m in a.methods if m not in METHODS]
    if unknown:
        ap.error(f"METHOD: no such method {unknown[0]!r}; expected one of: {', '.join(sorted(METHODS))}")
    if a.seeds < 1:
        ap.error(f"--seeds: expected 1 or more (2 or more for a row with an interval), got {a.seeds}")
    if a.jobs < 1:
        ap.error(f"--jobs: expected 1 or more, got {a.jobs}")
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    ledger = Path(a.arms) if a.arms else rows_path.with_name(f"{rows_path.stem}_arms.json")
    plan = Plan() if a.dry_run else None
    for method in a.methods:
        for task in a.task or [None]:
            row = reproduce(method, a.steps, seeds, Path(a.work), a.set, plan=plan, fresh=a.fresh, task=task,
                            ledger=ledger, jobs=a.jobs)
            if row is not None:
                append_row(rows_path, row)
                print(json.dumps(row))
    if plan is not None and len(a.methods) * len(a.task or [None]) > 1:
        print(f"in all: {len(plan.to_make)} distinct runs to make", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
