"""`upslope sweep` end to end on the tiny model: trials promoted by resuming their own checkpoints,
stopped ones cleaned up, the results files and a best config that loads; a finished sweep run again
trains nothing, and a killed one (a real SIGKILL of the sweep and its trial) continues to the same
results as one never interrupted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_helpers import metrics

from upslope.cli import main
from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.sweep.runner import Sweep, read_metric, read_series
from upslope.sweep.spec import spec_from_args

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


def test_read_metric_by_hand(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "reward/mean": 0.1}, {"step": 1, "eval/accuracy": 0.5}, {"step": 2, "reward/mean": 0.3},
            {"step": 3, "reward/mean": 0.4, "eval/accuracy": 0.9}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_metric(path, "reward/mean", 2) == (0.3, ["eval/accuracy", "reward/mean"])
    assert read_metric(path, "eval/accuracy", 1)[0] == 0.5
    assert read_metric(path, "eval/accuracy", 2)[0] is None  # an evaluation counts only at its own step
    assert read_metric(path, "loss", 3)[0] is None and read_metric(tmp_path / "none.jsonl", "loss", 1) == (None, [])


def test_trend_stops_promoted_trials_whose_training_metric_is_flat_or_collapsing(tiny_model_path, tmp_path):
    """Three trials' reward/mean written by hand; the rung keeps the best two by eval/mean_reward, then the
    trend drops t002 (collapsing) and, in a second sweep, all of them (the rung's best goes on alone)."""
    out = tmp_path / "sweep"
    flags = {"space": {"optim.lr": [1e-3, 2e-3, 3e-3]}, "budget": 3, "rungs": [4, 8], "eta": 2,
             "metric": "eval/mean_reward", "out": str(out), "trend_metric": "reward/mean", "trend_window": 3,
             "trend_drop": 0.3}
    sweep = Sweep(spec_from_args(None, flags, tiny(tiny_model_path)), say=lambda _: None)
    by_id = {t.id: t for t in sweep.trials}
    series = {"t000": [0.1, 0.2, 0.3, 0.4], "t001": [0.1, 0.5, 0.5, 0.5], "t002": [0.2, 0.8, 0.6, 0.4]}
    for tid, values in series.items():
        (out / "trials" / tid).mkdir(parents=True)
        (out / "trials" / tid / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "reward/mean": v}) + "\n" for i, v in enumerate(values)))
        by_id[tid].scores["4"] = {"t000": 0.2, "t001": 0.1, "t002": 0.9}[tid]
    assert read_series(out / "trials" / "t002" / "metrics.jsonl", "reward/mean", 3)[0] == [(1, 0.2), (2, 0.8), (3, 0.6)]
    # promoted by the rung metric: t002 (0.9) and t000 (0.2); t002 fell 0.8 -> 0.4 (0.4 > 0.3), t000 rises 0.1/step
    assert sweep.by_trend(["t000", "t002"], by_id, 4) == ["t000"]
    assert by_id["t002"].trend == "collapsing: 0.4 below the window's best" and by_id["t000"].trend is None
    # t001 is flat (slope 0 over steps 2-4); with t002 collapsing, the rung's best of the two goes on alone
    assert sweep.by_trend(["t001", "t002"], by_id, 4) == ["t002"] and by_id["t002"].trend is None
    assert by_id["t001"].trend == "flat: slope 0/step over 3 steps"
    with pytest.raises(ConfigError, match="--trend-metric reward/mean: trial t000 logged no such metric up to step 0"):
        sweep.by_trend(["t000"], by_id, 0)


def tiny(tiny_model_path: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "data.options.count=16", "eval.limit=2", "train.threads=1",
            "train.deterministic=true", "train.micro_batch_tokens=512", "log.tensorboard=false",
            f"reward=[{{name: '{TOY}:long_text'}}]"]


def sweep_args(out: Path, *extra: str) -> list[str]:
    return ["--space", "optim.lr=1e-3,3e-2", "--budget", "2", "--rungs", "1,2", "--eta", "2",
            "--metric", "eval/mean_reward", "--out", str(out), *extra]


def test_promotion_resumes_the_trial_and_the_best_config_loads(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", *sweep_args(out, "--executor", "inprocess"), *tiny(tiny_model_path)]) == 0
    res = json.loads((out / "results.json").read_text())
    first = {t["trial"]: t["scores"]["1"] for t in res["trials"]}
    best, other = sorted(first, key=lambda t: (-first[t], t))
    assert res["best"]["trial"] == best and res["steps_trained"] == 3 and res["steps_without_early_stopping"] == 4
    kept, stopped = out / "trials" / best, out / "trials" / other
    assert sorted(p.name for p in (kept / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    assert not (stopped / "checkpoints").exists() and (stopped / "metrics.jsonl").exists()
    records = metrics(kept)
    assert [r["step"] for r in records if "loss" in r] == [1, 2]  # step 1 not redone: resumed from its checkpoint
    assert [r["step"] for r in records if "eval/mean_reward" in r] == [1, 2]
    assert res["best"]["value"] == records[-1]["eval/mean_reward"]
    csv_rows = (out / "results.csv").read_text().splitlines()
    assert csv_rows[0] == "trial,optim.lr,eval/mean_reward@1,eval/mean_reward@2,status,seconds" and len(csv_rows) == 3
    cfg = load_config(out / "best.yaml")
    assert cfg.optim.lr == res["best"]["point"]["optim.lr"] and cfg.model.name == tiny_model_path
    shown = capsys.readouterr().out
    assert "stopped after step 1" in shown and f"best: {best}" in shown
    # run again: the state says everything is done, nothing trains, the same results come out
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("trials/*/metrics.jsonl")}
    assert main(["sweep", *sweep_args(out, "--executor", "inprocess"), *tiny(tiny_model_path)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("trials/*/metrics.jsonl")} == mtimes
    assert json.loads((out / "results.json").read_text())["trials"] == res["trials"]
    # another sweep in the same directory is refused in one line
    assert main(["sweep", *sweep_args(out, "--seed", "1"), *tiny(tiny_model_path)]) == 2
    assert "holds another sweep (seed: 0 there, 1 now)" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_sweep_continues_to_the_same_results(tiny_model_path, tmp_path):
    """Subprocess trials; the sweep (and the trial it is running) is SIGKILLed right after its first
    trial-rung is recorded, then started again with the same command."""
    cmd = [sys.executable, "-m", "upslope.cli", "sweep"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run([*cmd, *sweep_args(straight), *tiny(tiny_model_path)], check=True, capture_output=True)
    proc = subprocess.Popen([*cmd, *sweep_args(killed), *tiny(tiny_model_path)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = killed / "sweep.json"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if state.exists() and any(t["scores"] for t in json.loads(state.read_text())["trials"]):
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its running trial (one process group)
    proc.wait()
    done = json.loads(state.read_text())["trials"]
    assert sum(len(t["scores"]) for t in done) < 3  # it was killed before the end
    subprocess.run([*cmd, *sweep_args(killed), *tiny(tiny_model_path)], check=True, capture_output=True)
    a, b = (json.loads((d / "results.json").read_text()) for d in (straight, killed))
    assert [t["scores"] for t in a["trials"]] == [t["scores"] for t in b["trials"]]
    assert a["best"]["point"] == b["best"]["point"] and a["best"]["value"] == b["best"]["value"]
    assert "$ " in (killed / "trials" / "t000" / "trial.log").read_text()  # each trial-rung's command is logged
