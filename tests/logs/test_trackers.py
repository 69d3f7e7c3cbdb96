"""Experiment trackers, read back: one real `upslope train` of 2 steps (the tiny model, verl parquet data,
verl's compute_score) logs to TensorBoard, W&B (offline), trackio (a local database) and MLflow (a file
store in the run directory), and each tracker's own files are read here: the run config, every step's
metrics, and the table of sampled prompts, completions and rewards. Without a tracker's package its
part is skipped."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from markers import IN_CI_SLOW_SET

REPO = Path(__file__).resolve().parents[2]
FORMATS = REPO / "tests" / "fixtures" / "formats"
TRACKERS = [name for name in ("wandb", "trackio", "mlflow") if importlib.util.find_spec(name) is not None]
TABLE_COLUMNS = ["step", "group", "prompt", "completion", "answer", "reward", "reward/compute_score",
                 "reward/length_score"]


pytestmark = IN_CI_SLOW_SET  # a training run in its own process with three trackers: ~15 s


@pytest.fixture(scope="module")
def tracked_run(tiny_model_path, tmp_path_factory):
    """The run (a subprocess: trackio reads TRACKIO_DIR when imported) and its environment."""
    root = tmp_path_factory.mktemp("trackers")
    run_dir = root / "byo-run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "TRACKIO_DIR": str(root / "trackio"),
           "WANDB_SILENT": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    rewards = f"[{{name: '{FORMATS}/verl_reward.py:compute_score'}}, {{name: '{FORMATS}/verl_reward.py:length_score'}}]"
    argv = ["train", f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
            "train.steps=2", "eval.limit=2", "eval.max_new_tokens=4", "train.threads=1", "train.eval_before=false",
            f"data.path={FORMATS / 'verl_train.parquet'}", f"eval.data.path={FORMATS / 'verl_test.parquet'}",
            f"reward={rewards}", f"log.trackers=[{', '.join(TRACKERS)}]", "log.tensorboard=true",
            "log.table_every=1", "log.table_rows=3"]
    p = subprocess.run([sys.executable, "-m", "upslope.cli", *argv], cwd=root, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir, root, p


def test_the_run_says_where_each_tracker_wrote(tracked_run):
    run_dir, _, p = tracked_run
    out = " ".join(p.stdout.split())
    for name in TRACKERS:
        assert f"{name}: " in out
    assert "URL not available" not in p.stdout + p.stderr and "Trackio project initialized" not in out
    rows = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2] and list(rows[0]) == TABLE_COLUMNS
    assert rows[0]["prompt"].startswith("user: What is ") and rows[0]["answer"].isdigit()


def test_tensorboard_holds_the_metrics_and_the_table(tracked_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, _ = tracked_run
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [2]
    assert {"rollouts/text_summary", "config/text_summary"} <= set(acc.Tags()["tensors"])
    table = acc.Tensors("rollouts/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| " + " | ".join(TABLE_COLUMNS) + " |")


def wandb_records(path: str) -> list:
    """The records of an offline W&B run file: LevelDB-log framing (32 KiB blocks, 7-byte record headers,
    full/first/middle/last fragments) around protobuf Records, after a 7-byte W&B header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
    return out


def test_wandb_offline_run_holds_config_metrics_and_tables(tracked_run):
    if "wandb" not in TRACKERS:
        pytest.skip("wandb is not installed")
    run_dir, _, _ = tracked_run
    [path] = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = wandb_records(path)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert run.display_name == "byo-run" and config["rollout"]["n"] == 2 and config["log"]["trackers"][0]
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item} for r in records
               if r.WhichOneof("record_type") == "history"]
    rewards = [h for h in history if "reward/mean" in h]
    assert [h["_step"] for h in rewards] == [1, 2] and all("compute_score/acc" in h for h in rewards)
    tables = sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "files" / "media" / "table" / "*.json")))
    assert len(tables) == 2
    first = json.loads(Path(tables[0]).read_text())
    assert first["columns"] == TABLE_COLUMNS and len(first["data"]) == 3


def test_trackio_database_holds_config_metrics_and_tables(tracked_run):
    if "trackio" not in TRACKERS:
        pytest.skip("trackio is not installed")
    _, root, _ = tracked_run
    db = sqlite3.connect(root / "trackio" / "upslope.db")
    [(config,)] = db.execute("select config from configs where run_name = 'byo-run'").fetchall()
    assert json.loads(config)["rollout"]["n"] == 2
    rows = [(step, json.loads(m)) for step, m in
            db.execute("select step, metrics from metrics where run_name = 'byo-run' order by id")]
    assert [s for s, m in rows if "reward/mean" in m] == [1, 2]
    tables = [m["rollouts"] for _, m in rows if "rollouts" in m]
    assert len(tables) == 2 and tables[0]["_type"] == "trackio.table"
    assert list(tables[0]["_value"][0]) == TABLE_COLUMNS and len(tables[0]["_value"]) == 3


def test_mlflow_file_store_holds_params_metrics_and_tables(tracked_run, tmp_path, monkeypatch):
    if "mlflow" not in TRACKERS:
        pytest.skip("mlflow is not installed")
    from mlflow.tracking import MlflowClient

    run_dir, _, _ = tracked_run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("upslope").experiment_id])
    assert run.info.run_name == "byo-run" and run.data.params["rollout.n"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/pass_1")] == [2]  # '@' is not allowed
    files = sorted(f.path for f in client.list_artifacts(run.info.run_id, "rollouts"))
    assert files == ["rollouts/step_000001.json", "rollouts/step_000002.json"]
    table = json.loads(Path(client.download_artifacts(run.info.run_id, files[0], dst_path=str(tmp_path))).read_text())
    assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == 3
