"""Rollout workers on a real local Ray cluster (2 CPUs, started once for the module): staleness 0
is the synchronous loop bit for bit, staleness 1 overlaps with lags within the bound, a worker
killed with SIGKILL is restarted without losing a step, and a learner stopped after a checkpoint
resumes with the groups it had drawn ahead regenerated."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ray = pytest.importorskip("ray")

from upslope.config import load_config  # noqa: E402
from upslope.train.trainers.rl import Trainer  # noqa: E402

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module; the workers import this checkout."""
    for attempt in range(2):  # on a loaded machine the raylet may miss Ray's fixed 30 s start-up wait once
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
            break
        except Exception:
            ray.shutdown()
            if attempt:
                raise
    yield
    ray.shutdown()


def overrides(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=4", "rollout.n=4",
            "rollout.max_new_tokens=8", "train.eval_before=false", "train.eval_after=false",
            "train.micro_batch_tokens=512", "train.threads=1", "train.deterministic=true", "train.seed=3",
            "optim.lr=1e-3", f"reward=[{{name: '{TOY}:long_text'}}]", *extra]


def run(args: list[str], during=None) -> Trainer:
    trainer = Trainer(load_config(None, args))
    watcher = threading.Thread(target=during, args=(trainer,), daemon=True) if during else None
    try:
        if watcher:
            watcher.start()
        trainer.run()
    finally:
        trainer.close()
    return trainer


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def learning(rows_: list[dict]) -> list[dict]:
    """What must match between the loops: every metric but times, speeds and the pipeline's own."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "pipeline/")) and not k.endswith("tokens_per_s")}
            for r in rows_]


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")


@pytest.mark.slow
def test_staleness_zero_is_the_synchronous_loop_bit_for_bit(ray_cluster, tiny_model_path, tmp_path):
    """5 deterministic steps with 1 Ray worker at max_staleness=0 == the in-process loop: same
    metrics, same weights; every group had lag 0."""
    sync, pipe = tmp_path / "sync", tmp_path / "pipe"
    run(overrides(tiny_model_path, sync, "train.steps=5"))
    run(overrides(tiny_model_path, pipe, "train.steps=5", "dist.rollout_workers=1", "pipeline.max_staleness=0"))
    a, b = rows(sync), rows(pipe)
    assert len(a) == len(b) == 5
    assert learning(a) == learning(b)
    assert all(r["pipeline/lag_0"] == 4 and "pipeline/lag_1" not in r for r in b)
    wa, wb = weights(sync, 5), weights(pipe, 5)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (pipe / "timeline.jsonl").stat().st_size > 0


@pytest.mark.slow
def test_worker_killed_is_restarted_and_no_step_is_lost(ray_cluster, tiny_model_path, tmp_path, capsys):
    """max_staleness=1, chunks of 1 group: SIGKILL the worker while it generates step 2 or later;
    Ray restarts it, the weights are re-pushed, its groups re-issued, all 4 steps logged, lags <= 1."""
    killed: list[int] = []

    def kill_once(trainer: Trainer) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            pipe = getattr(trainer, "pipe", None)
            if pipe is not None and pipe.version >= 1 and pipe.inflight:
                pid = ray.get(pipe.workers[0].pid.remote())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    out = tmp_path / "kill"
    trainer = run(overrides(tiny_model_path, out, "train.steps=4", "dist.rollout_workers=1",
                            "pipeline.max_staleness=1", "pipeline.chunk_groups=1"), during=kill_once)
    assert killed, "the worker was never seen generating"
    r = rows(out)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert r[-1]["pipeline/restarts"] == 1 and trainer.pipe is None
    assert "rollout worker 0 died" in capsys.readouterr().err
    lags = {k for x in r for k in x if k.startswith("pipeline/lag_")}
    assert lags <= {"pipeline/lag_0", "pipeline/lag_1"}


@pytest.mark.slow
def test_learner_resume_regenerates_the_groups_drawn_ahead(ray_cluster, tiny_model_path, tmp_path, capsys):
    """max_staleness=1: stop after step 2 (its checkpoint holds steps 3 and 4 drawn ahead: 4 may be
    generated with the weights after step 2 and used at 3, lag 1), resume: their
    groups are regenerated with the checkpoint's weights, the run ends at step 4 with no step lost."""
    out = tmp_path / "resume"
    common = ["train.steps=4", "dist.rollout_workers=1", "pipeline.max_staleness=1", "train.save_every=2",
              "algo.correction.cap=2.0"]  # TIS against the stale sampler's log-probs
    run(overrides(tiny_model_path, out, *common, "train.stop_after=2"))
    state = torch.load(out / "checkpoints" / "step_000002" / "trainer.pt", weights_only=False)
    assert sorted(state["pipeline"]) == [3, 4]
    run(overrides(tiny_model_path, out, *common, "train.resume=latest"))
    assert "regenerating the groups of 2 step(s)" in capsys.readouterr().err
    r = rows(out)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert r[1]["pipeline/lag_1"] == 4 and r[1]["mismatch"] > 0  # step 2 was generated by v0, used at v1
    assert "tis/capped_frac" in r[1]  # the correction ran on the stale groups
