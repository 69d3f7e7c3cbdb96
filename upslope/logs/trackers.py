"""Experiment trackers (registry: tracker), chosen with `log.trackers`: TensorBoard, Weights & Biases,
trackio and MLflow. Each gets the run's config once, every logged step's metrics, and every
`log.table_every` steps a table of sampled prompts, completions and rewards.

A tracker is a function `(run: TrackerRun, *, options) -> Tracker`; its registry trait `package` is
the module it needs, checked when the run starts (before the model loads). All of them work without a
network: W&B with mode=offline (or WANDB_MODE=offline), trackio in its local database, MLflow in a
file store (RUN/mlruns unless a tracking URI is given)."""
from __future__ import annotations

import contextlib
import io
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from upslope.registry import TRACKERS


@dataclass
class TrackerRun:
    """What a tracker is started with: the run directory, its name, the resolved config (nested), and
    where to say where its records went."""

    run_dir: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    announce: Callable[[str], Any] = print


class Tracker:
    """A started tracker; the base class records nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """The numeric metrics of one step."""

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """A table of sampled completions (the same columns every time)."""

    def close(self) -> None:
        """Flush and finish the run."""


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: value} (trackers whose parameters are flat)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


# ------------------------------------------------------------------ TensorBoard


class _TensorBoard(Tracker):
    def __init__(self, run: TrackerRun):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run.run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + "\n".join(f"{k}: {v}" for k, v in flat(run.config).items()) + "\n```")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text("rollouts", "\n".join(lines), step)

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("tensorboard", package="tensorboard")
def tensorboard(run: TrackerRun) -> Tracker:
    """TensorBoard event files in RUN/tensorboard: scalars, the config and the tables as text."""
    return _TensorBoard(run)


# ------------------------------------------------------------------ Weights & Biases


class _WandB(Tracker):
    def __init__(self, run: TrackerRun, **init: Any):
        import wandb

        self.wandb = wandb
        settings = wandb.Settings(silent=True, console="off")  # the run's own output stays on the terminal
        self.run = wandb.init(dir=str(run.run_dir), config=run.config, settings=settings, **init)
        offline = getattr(self.run, "offline", False)  # asking an offline run for its URL prints a warning
        where = f"{self.run.dir} (offline; upload with `wandb sync`)" if offline else self.run.url
        run.announce(f"wandb: run {self.run.name} -> {where}")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({"rollouts": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


@TRACKERS.register("wandb", package="wandb")
def wandb(run: TrackerRun, *, project: str = "upslope", entity: str | None = None,
          mode: Literal["online", "offline", "disabled"] | None = None, tags: list[str] | None = None,
          name: str | None = None) -> Tracker:
    """Weights & Biases: metrics, the config, and the tables as wandb.Table (files under RUN/wandb).

    project: W&B project
    entity: W&B team or user (default: your default entity)
    mode: online, offline (no network; `wandb sync` later) or disabled (default: WANDB_MODE, else online)
    tags: tags of the run
    name: run name (default: the run directory's name)
    """
    init = {"project": project, "entity": entity, "name": name or run.name, "tags": tags}
    if mode is not None:
        init["mode"] = mode
    return _WandB(run, **init)


# ------------------------------------------------------------------ trackio


class _Trackio(Tracker):
    def __init__(self, run: TrackerRun, project: str, name: str, space_id: str | None):
        import inspect

        import trackio

        self.trackio = trackio
        init = {"project": project, "name": name, "config": run.config, "space_id": space_id,
                "auto_log_cpu": False, "auto_log_gpu": False}
        known = inspect.signature(trackio.init).parameters
        with contextlib.redirect_stdout(io.StringIO()):  # its banner would break up the run's own lines
            self.run = trackio.init(**{k: v for k, v in init.items() if k in known})
        where = f"Space {space_id}" if space_id else f"its local database (`trackio show --project {project}`)"
        run.announce(f"trackio: project {project}, run {name} -> {where}")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.trackio.log(metrics, step=step)

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.trackio.log({"rollouts": self.trackio.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.trackio.finish()


@TRACKERS.register("trackio", package="trackio")
def trackio(run: TrackerRun, *, project: str = "upslope", space_id: str | None = None,
            name: str | None = None) -> Tracker:
    """trackio: metrics, the config and the tables in its local database (TRACKIO_DIR), or a Space.

    project: trackio project
    space_id: a Hugging Face Space to sync to (default: local only)
    name: run name (default: the run directory's name)
    """
    return _Trackio(run, project, name or run.name, space_id)


# ------------------------------------------------------------------ MLflow

_MLFLOW_BAD = re.compile(r"[^\w\-. :/]")  # characters MLflow refuses in a metric or parameter name


class _MLflow(Tracker):
    def __init__(self, run: TrackerRun, uri: str, experiment: str, name: str):
        import logging

        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        params = [Param(_MLFLOW_BAD.sub("_", k), str(v)[:6000]) for k, v in flat(run.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        run.announce(f"mlflow: experiment {experiment}, run {name} ({self.run_id}) -> {uri}")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_MLFLOW_BAD.sub("_", k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        data = {c: [row[j] for row in rows] for j, c in enumerate(columns)}
        self.client.log_table(self.run_id, data=data, artifact_file=f"rollouts/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@TRACKERS.register("mlflow", package="mlflow")
def mlflow(run: TrackerRun, *, tracking_uri: str | None = None, experiment: str = "upslope",
           name: str | None = None) -> Tracker:
    """MLflow: metrics, the config as parameters, and the tables as artifacts rollouts/step_N.json.

    tracking_uri: MLflow tracking URI or a directory (default: MLFLOW_TRACKING_URI, else a file store in RUN/mlruns)
    experiment: MLflow experiment
    name: run name (default: the run directory's name)
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (run.run_dir / "mlruns").resolve().as_uri()
    if "://" not in uri:  # a directory
        uri = Path(uri).expanduser().resolve().as_uri()
    if uri.startswith("file:"):  # chosen by hand or by default: MLflow 3 asks for this opt-in to its file store
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return _MLflow(run, uri, experiment, name or run.name)
