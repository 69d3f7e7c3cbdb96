"""Rollout workers on a real local Ray cluster (2 CPUs, started once for the module): staleness 0
is the synchronous loop bit for bit, staleness 1 overlaps with lags within the bound, a worker
killed with SIGKILL is restarted without losing a step, and a learner stopped after a checkpoint
resumes with the groups it had drawn ahead regenerated. Dynamic sampling through the pipe is the
synchronous loop's too, and with the streamed update (round 0's groups forwarded while round 1 is
generated) the same update to float32 rounding; two workers share the jobs and stream; with
partial=discard the jobs in flight at a weight push are regenerated; weights reach the workers as
read-only arrays in the object store."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from run_helpers import learning, metrics
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


def assert_same_learning(a: list[dict], b: list[dict]) -> None:
    """What must match between the loops, every metric but times, speeds and the pipeline's own, equal in two
    runs, naming the metrics that differ."""
    assert len(a) == len(b)
    for x, y in zip(learning(a, "pipeline/"), learning(b, "pipeline/")):
        diff = {k: (x.get(k), y.get(k)) for k in x.keys() | y.keys() if x.get(k) != y.get(k)}
        assert not diff, f"step {x.get('step')}: {diff}"


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")


@pytest.mark.slow
def test_staleness_zero_is_the_synchronous_loop_bit_for_bit(ray_cluster, tiny_model_path, tmp_path):
    """5 deterministic steps with 1 Ray worker at max_staleness=0 == the in-process loop: same
    metrics, same weights; every group had lag 0."""
    sync, pipe = tmp_path / "sync", tmp_path / "pipe"
    run(overrides(tiny_model_path, sync, "train.steps=5"))
    run(overrides(tiny_model_path, pipe, "train.steps=5", "dist.rollout_workers=1", "pipeline.max_staleness=0"))
    a, b = metrics(sync), metrics(pipe)
    assert len(a) == len(b) == 5
    assert learning(a, "pipeline/") == learning(b, "pipeline/")
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
            pipe = getattr(getattr(trainer, "source", None), "pipe", None)  # the RayPipeline's worker pipe
            if pipe is not None and pipe.version >= 1 and pipe.inflight:
                pid = ray.get(pipe.workers[0].pid.remote())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    out = tmp_path / "kill"
    trainer = run(overrides(tiny_model_path, out, "train.steps=4", "dist.rollout_workers=1",
                            "pipeline.max_staleness=1", "pipeline.chunk_groups=1", "pipeline.stale_correction=uncorrected"),
                  during=kill_once)
    assert killed, "the worker was never seen generating"
    r = metrics(out)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert r[-1]["pipeline/restarts"] == 1 and trainer.source is None
    err = capsys.readouterr().err
    assert "rollout worker 0 died" in err
    # stale samples left uncorrected by choice: the RL trainer warns once it has workers (rich wraps the
    # line at the console width)
    assert "pipeline.max_staleness=1 with the ratio against the learner's own log-probs" in " ".join(err.split())
    lags = {k for x in r for k in x if k.startswith("pipeline/lag_")}
    assert lags <= {"pipeline/lag_0", "pipeline/lag_1"}


@pytest.mark.slow
def test_learner_resume_regenerates_the_groups_drawn_ahead(ray_cluster, tiny_model_path, tmp_path, capsys):
    """max_staleness=1: stop after step 2 (its checkpoint holds steps 3 and 4 drawn ahead: 4 may be
    generated with the weights after step 2 and used at 3, lag 1), resume: their
    groups are regenerated with the checkpoint's weights, the run ends at step 4 with no step lost."""
    out = tmp_path / "resume"
    common = ["train.steps=4", "dist.rollout_workers=1", "pipeline.max_staleness=1", "train.save_every=2",
              "pipeline.stale_correction=token"]  # TIS: the learner's old log-probs against the stale sampler's
    run(overrides(tiny_model_path, out, *common, "train.stop_after=2"))
    state = torch.load(out / "checkpoints" / "step_000002" / "trainer.pt", weights_only=False)
    assert sorted(state["pipeline"]) == [3, 4]
    run(overrides(tiny_model_path, out, *common, "train.resume=latest"))
    assert "regenerating the groups of 2 step(s)" in capsys.readouterr().err
    r = metrics(out)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert r[1]["pipeline/lag_1"] == 4 and r[1]["mismatch"] > 0  # step 2 was generated by v0, used at v1
    assert "tis/capped_frac" in r[1]  # the correction ran on the stale groups


def step_weights_close(a: Path, b: Path, step: int, atol: float) -> None:
    wa, wb = weights(a, step), weights(b, step)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol, msg=k)


@pytest.mark.slow
def test_dynamic_sampling_through_the_pipe(ray_cluster, tiny_model_path, tmp_path):
    """DAPO's nonzero_std filter with refill rounds (a coin-flip reward, groups of 2: half of them tie):
    at staleness 0 without streaming, the pipe is the synchronous loop bit for bit, refills included;
    with streaming (the default) round 0's kept groups are forwarded while round 1 is generated, and
    step 1's update is the same to float32 rounding (AdamW eps large enough that rounding noise in a
    tiny gradient entry cannot become an lr-sized step)."""
    common = ["train.steps=2", "train.save_every=1", "rollout.n=2", "algo.filters=[{name: nonzero_std}]",
              "rollout.max_resample_rounds=3", f"reward=[{{name: '{TOY}:even_length'}}]", "optim.eps=1e-4",
              "train.precision=float32", "model.dtype=float32", "engine.dtype=float32"]  # (auto may pick bf16)
    sync, whole, streamed = tmp_path / "sync", tmp_path / "whole", tmp_path / "streamed"
    pipe = ["dist.rollout_workers=1", "pipeline.max_staleness=0"]
    run(overrides(tiny_model_path, sync, *common))
    run(overrides(tiny_model_path, whole, *common, *pipe, "pipeline.stream=false"))
    run(overrides(tiny_model_path, streamed, *common, *pipe))
    a, b, c = metrics(sync), metrics(whole), metrics(streamed)
    assert a[0]["filter/groups_dropped"] > 0 and a[0]["rollout/prompts_drawn"] > 4  # step 1 refilled
    assert_same_learning(a, b)
    wa, wb = weights(sync, 2), weights(whole, 2)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert "pipeline/streamed_groups" not in b[0] and c[0]["pipeline/streamed_groups"] > 0
    assert c[0]["rollout/groups_kept"] == a[0]["rollout/groups_kept"] == 4
    for k in ("rollout/prompts_drawn", "filter/groups_dropped", "reward/mean"):  # the same rollouts at step 1
        assert c[0][k] == a[0][k], k
    for k in ("loss", "grad_norm", "entropy"):
        assert c[0][k] == pytest.approx(a[0][k], rel=1e-4, abs=1e-7), k
    step_weights_close(streamed, sync, 1, atol=2e-5)


@pytest.mark.slow
def test_two_workers_share_the_jobs_and_the_learner_streams(ray_cluster, tiny_model_path, tmp_path):
    """2 HF workers, jobs of one group, max_staleness=1: both generate, every step gets its 4 groups
    with lags <= 1, groups are forwarded before their batch is complete, and each weight push is
    loaded by both workers (timeline `load` bars, pipeline/weight_load_s)."""
    out = tmp_path / "two"
    run(overrides(tiny_model_path, out, "train.steps=3", "dist.rollout_workers=2", "pipeline.max_staleness=1",
                  "pipeline.chunk_groups=1", "rollout.max_new_tokens=16"))
    r = metrics(out)
    assert [x["step"] for x in r] == [1, 2, 3]
    for w in (0, 1):
        assert sum(x[f"pipeline/worker{w}_busy"] for x in r) > 0 and any(x[f"pipeline/worker{w}_tokens_per_s"] for x in r)
    assert all(sum(v for k, v in x.items() if k.startswith("pipeline/lag_")) == 4 for x in r)
    assert {k for x in r for k in x if k.startswith("pipeline/lag_")} <= {"pipeline/lag_0", "pipeline/lag_1"}
    assert sum(x["pipeline/streamed_groups"] for x in r) > 0
    assert any(x["pipeline/weight_load_s"] > 0 for x in r)
    # stale samples are bounded by default (pipeline.stale_correction=clip: the ratio against the sampler's
    # log-probs, so it is no longer exactly 1 and the clip acts on lag-1 groups)
    assert any(x["ratio_mean"] != 1.0 for x in r)
    events = [json.loads(x) for x in (out / "timeline.jsonl").read_text().splitlines()]
    loads = {e["who"] for e in events if e.get("kind") == "load"}
    assert loads == {"worker0", "worker1"}


@pytest.mark.slow
def test_partial_discard_regenerates_the_jobs_in_flight_at_a_push(ray_cluster, tiny_model_path, tmp_path):
    """partial=discard, max_staleness=1, jobs of one group, REINFORCE++ (batch whitening: the learner
    waits for each whole batch, nothing is streamed): when new weights are pushed, the jobs a worker
    holds (dispatched, queue_depth 2 of the next step's 4) are discarded and regenerated, and the run
    loses no step."""
    out = tmp_path / "discard"
    run(overrides(tiny_model_path, out, "train.steps=3", "dist.rollout_workers=1", "pipeline.max_staleness=1",
                  "pipeline.chunk_groups=1", "pipeline.partial=discard", "algo.advantage.name=reinforce_pp"))
    r = metrics(out)
    assert [x["step"] for x in r] == [1, 2, 3]
    assert sum(x["pipeline/discarded_groups"] for x in r) >= 2
    assert all(sum(v for k, v in x.items() if k.startswith("pipeline/lag_")) == 4 for x in r)
    assert not any("pipeline/streamed_groups" in x for x in r)  # a whole-batch estimator is not streamed


USER_ROLLOUT = '''
import os

from upslope.registry import ROLLOUTS
from upslope.rollout.plugin import single_turn


@ROLLOUTS.register("user_tagged")
def user_tagged(engine, prompt_ids, examples, params, pad_id, group_offset=0):
    """The single-turn rollout, each sample tagged with the process that generated it."""
    batch = single_turn(engine, prompt_ids, examples, params, pad_id, group_offset)
    for m in batch.meta:
        m["metrics"] = {"user_rollout/pid": float(os.getpid())}
    return batch
'''


@pytest.mark.slow
def test_a_users_rollout_plugin_file_runs_in_the_ray_worker(ray_cluster, tiny_model_path, tmp_path):
    """plugins=[file.py] naming the rollout: the worker, whose config arrives pickled, imports the file
    itself and generates with the user's rollout (its samples carry the worker's process id)."""
    plugin = tmp_path / "user_rollout.py"
    plugin.write_text(USER_ROLLOUT)
    out = tmp_path / "user"
    run(overrides(tiny_model_path, out, "train.steps=1", "dist.rollout_workers=1", f"plugins=[{plugin}]",
                  "rollout.kind=user_tagged"))
    (r,) = metrics(out)
    assert r["user_rollout/pid"] > 0 and r["user_rollout/pid"] != float(os.getpid())


@pytest.mark.slow
def test_weights_reach_a_worker_as_read_only_arrays_in_the_object_store(ray_cluster):
    """What set_weights receives: the object store's buffers themselves (read-only numpy, no copy),
    which unpack to the pushed tensors exactly."""
    from upslope.distributed.ray_workers import pack_weights, put_weights, unpack_weights

    state = {"a": torch.randn(64, 32), "b": torch.randn(8).to(torch.bfloat16)}

    @ray.remote
    def receive(packed):
        return [not raw.flags.writeable for raw, _, _ in packed.values()], {k: v.clone() for k, v in unpack_weights(packed)}

    read_only, back = ray.get(receive.remote(put_weights(state.items())))
    assert all(read_only) and len(read_only) == len(pack_weights(state.items()))
    assert all(torch.equal(back[k], state[k]) for k in state)
