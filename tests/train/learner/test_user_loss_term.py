"""A new RL loss term from a user's plugin file, exactly as docs/architecture.md prints it: under 30
lines, it adds its part to the loss by hand-computed numbers, trains through `upslope train`, and
reaches every learner rank (`upslope.train(cfg)` with dist.learner_procs=2 imports the file there)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from run_helpers import metrics

from upslope.algos.aggregate import loss_normalizers
from upslope.batch import Batch
from upslope.cli import main
from upslope.config import load_config
from upslope.train.learner.logprobs import HeadOutput
from upslope.train.learner.objectives import RLObjective

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
TINY_RUN = ["engine.name=hf", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=8",
            "train.eval_before=false", "train.eval_after=false", "log.progress=false", "log.plot=false",
            "log.tensorboard=false", "model.dtype=float32", "engine.dtype=float32", "train.precision=float32"]
TOY = Path(__file__).resolve().parents[2] / "fixtures" / "toy_rewards.py"


def doc_example() -> tuple[str, str]:
    """(file name, file text) of the loss-term example in docs/architecture.md."""
    found = re.search(r"```python\n(# (\S+\.py): .*?)```", DOC.read_text(), re.S)
    assert found, "docs/architecture.md lost its loss-term example"
    return found.group(2), found.group(1)


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory) -> Path:
    """The example written once (a process imports one file per plugin name)."""
    name, code = doc_example()
    path = tmp_path_factory.mktemp("loss-term") / name
    path.write_text(code)
    return path


def rows() -> Batch:
    """Two rows of 3 trained tokens, advantages +1 and -1, old log-probs log 0.5."""
    n = 2
    return Batch(input_ids=torch.zeros(n, 3, dtype=torch.long), attention_mask=torch.ones(n, 3, dtype=torch.bool),
                 loss_mask=torch.ones(n, 3), prompt_lens=torch.zeros(n, dtype=torch.long),
                 seq_lens=torch.full((n,), 3), group_ids=torch.zeros(n, dtype=torch.long),
                 sampler_logprobs=torch.full((n, 3), math.log(0.5)), old_logprobs=torch.full((n, 3), math.log(0.5)),
                 truncated=torch.zeros(n, dtype=torch.bool), policy_version=torch.zeros(n, dtype=torch.long),
                 advantages=torch.tensor([[1.0] * 3, [-1.0] * 3]))


def test_the_example_is_short_and_adds_its_part_to_the_loss(plugin_file):
    """loss(with the term) - loss(without) = coef x the token mean of (log pi - log pi_old)^2, by hand;
    its metric is that mean; the policy loss and its metrics are untouched."""
    name, code = doc_example()
    assert len(code.strip().splitlines()) < 30
    cfg = load_config(None, [f"plugins=[{plugin_file}]", "algo.terms=[{name: log_ratio_l2, options: {coef: 0.5}}]"])
    plain = RLObjective.from_config(load_config(None, []))
    with_term = RLObjective.from_config(cfg)
    batch = rows()
    lp = batch.old_logprobs + torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.0, 0.0]])
    norms = loss_normalizers(batch.loss_mask)
    a = plain.loss(HeadOutput(lp, torch.zeros_like(lp)), batch, norms)
    b = with_term.loss(HeadOutput(lp, torch.zeros_like(lp)), batch, norms)
    mean_sq = (0.01 + 0.04 + 0.09) / 6
    assert float(b.loss - a.loss) == pytest.approx(0.5 * mean_sq, rel=1e-5)
    assert b.metrics["log_ratio_l2/mean"] == pytest.approx(mean_sq, rel=1e-5)
    assert {k: float(v) for k, v in a.metrics.items()} == {k: float(v) for k, v in b.metrics.items()
                                                           if k in a.metrics}
    assert not with_term.skips_rows  # the term acts on rows whose advantage is 0 too


def test_the_example_trains_through_the_command_line(plugin_file, tiny_model_path, tmp_path, capsys):
    """Two optimiser steps per batch, so the second sees a policy that moved: the term's metric is logged."""
    run = tmp_path / "run"
    status = main(["train", f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN, "train.steps=1",
                   "train.updates_per_batch=2", f"plugins=[{plugin_file}]", f"reward=[{{name: '{TOY}:long_text'}}]",
                   "algo.terms=[{name: log_ratio_l2, options: {coef: 0.5}}]", "optim.lr=1e-3"])
    assert status == 0, capsys.readouterr().err
    (record,) = metrics(run)
    assert record["log_ratio_l2/mean"] >= 0.0 and math.isfinite(record["loss"])


@pytest.mark.slow  # two spawned ranks: ~1-2 min on 2 busy cores
def test_python_api_runs_the_learner_ranks_with_the_users_plugins(plugin_file, tiny_model_path, tmp_path):
    """`upslope.train(cfg)` honours dist.learner_procs as the command line does: 2 ranks, each of which
    imports the plugin file (its loss term is built on every rank), a sharded checkpoint."""
    import upslope

    run = tmp_path / "run"
    cfg = load_config(None, [f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN, "train.steps=1",
                             "dist.learner_procs=2", "dist.strategy=ddp", f"plugins=[{plugin_file}]",
                             "algo.terms=[{name: log_ratio_l2, options: {coef: 0.5}}]"])
    upslope.train(cfg)
    step1 = run / "checkpoints" / "step_000001"
    assert (step1 / "sharded" / ".metadata").is_file()
    (record,) = metrics(run)
    assert "log_ratio_l2/mean" in record

