"""MoE options through `upslope train` on a tiny random-init Qwen3-MoE (hf engine, fp32): with
algo.routing_replay every forward of the policy over the batch (the update's, and the old log-probs'
with two updates per batch) replays the experts the engine recorded, and the load_balance term adds the
routers' load-balancing loss; with neither, nothing is replayed or hooked."""
from __future__ import annotations

from pathlib import Path

import pytest
from run_helpers import metrics

from upslope import routing
from upslope.cli import main
from upslope.families import make_family_model


@pytest.fixture(scope="module")
def moe_model(smollm_path, tmp_path_factory):
    return make_family_model("qwen3_moe", smollm_path, tmp_path_factory.mktemp("moe-train") / "qwen3_moe")


def train(model: str, run_dir: Path, *extra: str) -> list[dict]:
    assert main(["train", f"model.name={model}", "engine.name=hf", f"run_dir={run_dir}", "train.steps=2",
                 "train.eval_before=false", "train.eval_after=false", "log.progress=false", "log.plot=false",
                 "log.tensorboard=false", "train.precision=float32", "model.dtype=float32", "engine.dtype=float32",
                 "optim.lr=1e-2", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6",
                 "train.threads=1", "train.skip_zero_advantage=false", "train.updates_per_batch=2",
                 "data.options={count: 16}", *extra]) == 0
    return metrics(run_dir)


def counting_replays(monkeypatch) -> list[int]:
    """The number of rows of each replayed forward (a call of routing.replaying with recorded experts)."""
    calls: list[int] = []
    real = routing.replaying

    def counted(model, experts):
        if experts is not None:
            calls.append(int(experts.shape[0]))
        return real(model, experts)

    monkeypatch.setattr(routing, "replaying", counted)
    return calls


def test_replay_and_the_load_balancing_term_through_upslope_train(moe_model, tmp_path, monkeypatch):
    calls = counting_replays(monkeypatch)
    rows = train(moe_model, tmp_path / "on", "algo.routing_replay=true",
                 "algo.terms=[{name: load_balance, options: {coef: 0.01}}]", "train.share_prompt=false",
                 "train.grad_checkpointing=false")
    assert len(rows) == 2 and all(r["mismatch"] < 1e-4 and r["router/load_balance"] > 0 for r in rows)
    # per step: the old log-probs' no-grad pass over the 8 rows, then one forward per mini-batch (a group each)
    assert calls == [8, 4, 4] * 2, calls
    shared = train(moe_model, tmp_path / "shared", "algo.routing_replay=true")  # shared prompts, checkpointed layers
    assert all(r["mismatch"] < 1e-4 for r in shared)


def test_with_the_options_off_nothing_is_replayed(moe_model, tmp_path, monkeypatch):
    calls = counting_replays(monkeypatch)
    rows = train(moe_model, tmp_path / "off")
    assert len(rows) == 2 and not calls and all("router/load_balance" not in r for r in rows)
