"""Kill-and-resume torture test: SIGKILL a training run at N random moments, resume it each
time with `train.resume=latest`, and check that the result is bit-identical to an
uninterrupted run of the same configuration.

    python benchmarks/torture.py                                   # the default recipe, 10 kills
    python benchmarks/torture.py --kills 3 --steps 6 --seed 1 model.name=DIR engine.name=hf

Both runs are deterministic (`train.deterministic=true`), checkpoint every step
(`train.save_every=1`) and use a fixed thread count (`train.threads`, default: every core),
each in a fresh `run_dir` under a temporary directory. The uninterrupted run comes first: it
is the reference, and the times at which its checkpoints appeared set the scale of the kill
moments. Each kill moment is a random delay after the trainer process started (30% of kills;
uniform up to the reference's time to its first checkpoint) or after the next new checkpoint
appeared (uniform up to the longest gap the reference showed between two checkpoints or
between the last one and its end), so it can land in set-up, rollout, reward, learner,
checkpoint writing or evaluation. The whole process group gets SIGKILL; the next process resumes with
`train.resume=latest` (or starts afresh when no checkpoint existed yet), and its log must say
"resumed from <that checkpoint>".

Per kill, the metric records the resumed process wrote (up to the next kill or the end) are
compared with the reference's records of the same steps; at the end the whole metrics.jsonl
and the final weights (every safetensors tensor) are compared. Timing keys (time/*,
*/tokens_per_s, *seconds*) are left out of the metric comparison. Prints one row per kill and
`torture: K/N kills resumed identically`; exit status 1 when any kill (or the final
comparison) differs.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from upslope.logs.sinks import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TIMING_KEY = re.compile(r"(^time/|per_s$|seconds|(^|/)elapsed|(^|/)wall)")


# ---------------------------------------------------------------- comparison


def is_timing_key(key: str) -> bool:
    """Keys that measure time (never reproducible): time/*, */tokens_per_s, eval/gen_seconds, ..."""
    return bool(TIMING_KEY.search(key))


def strip_timing(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def compare_metrics(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Differences between two lists of metric records (timing keys excluded); [] when identical."""
    a, b = strip_timing(a), strip_timing(b)
    diffs = []
    if len(a) != len(b):
        diffs.append(f"{len(a)} records vs {len(b)}")
    for i, (ra, rb) in enumerate(zip(a, b)):
        if ra == rb:
            continue
        keys = sorted(set(ra) | set(rb))
        bad = [k for k in keys if ra.get(k, "<absent>") != rb.get(k, "<absent>")]
        k = bad[0]
        diffs.append(f"record {i} (step {ra.get('step')}): {len(bad)} keys differ, e.g. {k}: "
                     f"{ra.get(k, '<absent>')!r} vs {rb.get(k, '<absent>')!r}")
    return diffs


def compare_weights(a: Path, b: Path) -> list[str]:
    """Differences between the safetensors tensors of two model directories; [] when identical."""
    import torch
    from safetensors.torch import load_file

    def load(d: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sorted(d.glob("*.safetensors")):
            out.update(load_file(f))
        return out

    ta, tb = load(a), load(b)
    if not ta or not tb:
        return [f"no safetensors weights in {a if not ta else b}"]
    diffs = []
    if ta.keys() != tb.keys():
        diffs.append(f"tensor names differ: {sorted(set(ta) ^ set(tb))[:3]}")
    for k in sorted(set(ta) & set(tb)):
        if ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape or not torch.equal(ta[k], tb[k]):
            diffs.append(f"tensor {k} differs")
    return diffs


# ---------------------------------------------------------------- running


def latest_step(run_dir: Path) -> int:
    """Step of the newest complete checkpoint (0: none)."""
    pointer = run_dir / "checkpoints" / "latest"
    try:
        m = re.fullmatch(r"step_(\d+)", pointer.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return 0
    return int(m.group(1)) if m else 0


def final_weights(run_dir: Path, steps: int) -> Path:
    return run_dir / "checkpoints" / f"step_{steps:06d}" / "model"


def train_cmd(run_dir: Path, steps: int, threads: int, overrides: list[str], resume: bool) -> list[str]:
    fixed = [f"run_dir={run_dir}", f"train.steps={steps}", "train.deterministic=true", "train.save_every=1",
             f"train.threads={threads}", "log.progress=false"]
    return [sys.executable, "-m", "upslope.cli", "train", *fixed, *overrides,
            *(["train.resume=latest"] if resume else [])]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               COLUMNS="1000")  # the console must not wrap "resumed from <path> at step N" into lines
    fh = open(log, "w")
    try:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)  # its own process group: the kill reaches every child
    finally:
        fh.close()


def reference_run(run_dir: Path, log: Path, cmd: list[str], timeout: float) -> tuple[int, list[float]]:
    """Run uninterrupted; returns (exit code, the gaps in seconds between process start, each new
    checkpoint and process end)."""
    proc = start(cmd, log)
    t0 = time.monotonic()
    events, seen = [t0], 0
    while proc.poll() is None:
        if time.monotonic() - t0 > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return 124, []
        s = latest_step(run_dir)
        if s != seen:
            seen = s
            events.append(time.monotonic())
        time.sleep(0.05)
    events.append(time.monotonic())
    return proc.returncode, [b - a for a, b in zip(events, events[1:])]


@dataclass
class Kill:
    index: int
    moment: str = ""            # e.g. "start+3.21s" or "ckpt 4+0.80s"
    where: str = ""             # what the files say was going on
    reached: int = 0            # newest complete checkpoint when killed
    resumed_from: str = ""      # what the next process said it resumed from
    steps_checked: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.problems


def where_killed(run_dir: Path, reached: int, steps: int, logged: int, since: float) -> str:
    """What the files say the process was doing (a partial checkpoint it began, records past the
    newest checkpoint, ...); `since`: the process's start (wall clock), to skip older partial writes."""
    ck = run_dir / "checkpoints"
    if ck.is_dir() and any(p.name.startswith(".tmp-step_") and p.stat().st_mtime >= since for p in ck.iterdir()):
        return "checkpoint write"
    if reached >= steps:
        return "after final checkpoint (final eval / shutdown)"
    if logged > reached:
        return f"after step {logged} logged (eval or checkpoint)"
    if reached == 0 and logged == 0:
        return "set-up / first step"
    return f"in step {reached + 1}"


def torture(args: argparse.Namespace, overrides: list[str], tmp: Path) -> int:
    threads = args.threads or os.cpu_count() or 1
    rng = random.Random(args.seed)
    ref_dir, run_dir, logs = tmp / "reference", tmp / "tortured", tmp / "logs"
    logs.mkdir()

    print(f"reference: {args.steps} steps uninterrupted in {ref_dir}", flush=True)
    rc, gaps = reference_run(ref_dir, logs / "reference.log",
                             train_cmd(ref_dir, args.steps, threads, overrides, resume=False), args.timeout)
    if rc != 0:
        print((logs / "reference.log").read_text()[-3000:], file=sys.stderr)
        print(f"torture: the reference run failed (exit {rc}); nothing to compare", file=sys.stderr)
        return 2
    ref_rows = read_metrics(ref_dir / "metrics.jsonl")
    # start -> first checkpoint (set-up, evaluation before, step 1), then between checkpoints (a
    # step, evaluations, the checkpoint write) and from the last checkpoint to the end (final evaluation)
    span_start, span_ckpt = gaps[0] * 1.1, max(gaps[1:] or gaps) * 1.1
    print(f"reference done in {sum(gaps):.1f}s; kill delays drawn from 0-{span_start:.1f}s after a start "
          f"or 0-{span_ckpt:.1f}s after a new checkpoint", flush=True)

    kills: list[Kill] = []
    segment = 0
    completed = False
    while not completed:
        segment += 1
        log = logs / f"segment_{segment:02d}.log"
        expect_from = latest_step(run_dir)
        resume = expect_from > 0
        proc = start(train_cmd(run_dir, args.steps, threads, overrides, resume=resume), log)
        t0, wall0 = time.monotonic(), time.time()
        kill = Kill(len(kills) + 1) if len(kills) < args.kills else None
        if kill is not None:
            anchor = "start" if rng.random() < 0.3 else "checkpoint"
            delay = rng.uniform(0.0, span_start if anchor == "start" else span_ckpt)
        deadline_anchor = t0
        anchored = kill is None or anchor == "start"
        seen = latest_step(run_dir)
        killed = False
        while proc.poll() is None:
            now = time.monotonic()
            if now - t0 > args.timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                print(log.read_text()[-3000:], file=sys.stderr)
                print(f"torture: segment {segment} ran over {args.timeout:.0f}s", file=sys.stderr)
                return 2
            if kill is not None:
                if not anchored and latest_step(run_dir) != seen:
                    anchored, deadline_anchor = True, now
                    kill.moment = f"ckpt {latest_step(run_dir)}+{delay:.2f}s"
                if anchored and now - deadline_anchor >= delay:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed = True
                    if not kill.moment:
                        kill.moment = f"start+{delay:.2f}s"
                    break
            time.sleep(0.01)
        text = log.read_text(errors="replace")
        rows = read_metrics(run_dir / "metrics.jsonl")

        # the segment that just ended checks the previous kill: did it resume, and did its records match?
        if kills and not kills[-1].resumed_from:
            prev = kills[-1]
            m = re.search(r"resumed from (\S+) at step (\d+)", text)
            if expect_from == 0:
                prev.resumed_from = "fresh (no checkpoint yet)"
            elif "leaves nothing to train" in text and expect_from >= args.steps:
                prev.resumed_from = f"step_{expect_from:06d}: final, refused"
            elif not m and killed:  # the next kill came before it got that far; that one checks it
                prev.resumed_from = "- (killed first)"
            elif not m:
                prev.resumed_from = "-"
                prev.problems.append("the resumed process never said 'resumed from'")
            else:
                prev.resumed_from = Path(m.group(1)).name
                if int(m.group(2)) != expect_from:
                    prev.problems.append(f"resumed from step {m.group(2)}, latest was {expect_from}")
            # (killed before it resumed: the records past the checkpoint are the last segment's, not its own)
            mine = [r for r in rows if r.get("step", 0) > expect_from] if m or not resume else []
            steps = sorted({r["step"] for r in mine})
            want = [r for r in ref_rows if expect_from < r.get("step", 0) and r.get("step", 0) in steps]
            # a kill can tear off the segment's last record (or the eval record of its last step)
            if killed and len(mine) < len(want):
                want = want[:len(mine)]
            prev.steps_checked = steps
            prev.problems += compare_metrics(mine, want)

        if not killed:
            if proc.returncode == 0:
                completed = True
                break
            if "leaves nothing to train" in text and latest_step(run_dir) >= args.steps:
                # killed after the final checkpoint: training is complete, resume is refused
                completed = True
                break
            print(text[-3000:], file=sys.stderr)
            print(f"torture: segment {segment} failed (exit {proc.returncode})", file=sys.stderr)
            return 2

        kill.reached = latest_step(run_dir)
        logged = max((r.get("step", 0) for r in rows), default=0)
        if resume and not re.search(r"resumed from \S+ at step", text):
            kill.where = "set-up, before the resume"
        else:
            kill.where = where_killed(run_dir, kill.reached, args.steps, logged, wall0)
        kills.append(kill)
        print(f"kill {kill.index}: {kill.moment} ({kill.where}), checkpoint step {kill.reached}", flush=True)
        if kill.reached == 0:  # nothing to resume from: start afresh, as a user would
            shutil.rmtree(run_dir, ignore_errors=True)

    # the final comparison belongs to the last kill's segment
    final: list[str] = []
    final += [f"metrics.jsonl: {d}" for d in compare_metrics(read_metrics(run_dir / "metrics.jsonl"), ref_rows)]
    final += [f"weights: {d}" for d in compare_weights(final_weights(run_dir, args.steps),
                                                       final_weights(ref_dir, args.steps))]
    if final and kills:
        kills[-1].problems += final

    print()
    head = (f"{'kill':>4}  {'moment':<18} {'where':<44} {'reached':>7}  {'resumed from':<26} "
            f"{'steps checked':<14} identical")
    print(head)
    print("-" * len(head))
    for k in kills:
        checked = f"{k.steps_checked[0]}-{k.steps_checked[-1]}" if k.steps_checked else "-"
        print(f"{k.index:>4}  {k.moment:<18} {k.where[:44]:<44} {k.reached:>7}  {k.resumed_from:<26} "
              f"{checked:<14} {'yes' if k.identical else 'NO'}")
        for p in k.problems[:5]:
            print(f"      ! {p}")
    if len(kills) < args.kills:
        print(f"note: the run completed after {len(kills)} of {args.kills} kills (raise --steps for more)")
    print(f"final: metrics.jsonl ({len(ref_rows)} records) and {args.steps}-step weights "
          f"{'identical' if not final else 'DIFFER'}")
    ok = sum(k.identical for k in kills)
    print(f"torture: {ok}/{len(kills)} kills resumed identically")
    return 0 if ok == len(kills) and not final and kills else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs to deliver (default 10)")
    p.add_argument("--steps", type=int, default=24, help="train.steps of both runs (default 24)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    p.add_argument("--threads", type=int, default=0, help="train.threads of both runs (default: every core)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one process may run before giving up")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (run dirs and logs)")
    p.add_argument("overrides", nargs="*", help="config overrides for both runs, e.g. model.name=DIR engine.name=hf")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="upslope-torture-"))
    try:
        return torture(args, args.overrides, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
