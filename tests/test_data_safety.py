"""Data safety: no command deletes or overwrites what it did not create (export targets, the
current directory, a run, user directories beside checkpoints), a full or read-only disk leaves
what was saved before intact, and no NaN/inf reaches saved weights (inf rewards fall back like
NaN, a non-finite gradient skips the step, a checkpoint with non-finite values is refused)."""
from __future__ import annotations

import contextlib
import hashlib
import math
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import torch
from run_helpers import metrics
from safetensors.torch import load_file

from upslope import checkpoint as ckpt
from upslope.batch import build_batch
from upslope.cli import main
from upslope.config import load_config
from upslope.errors import UpslopeError
from upslope.models import load_model, load_tokenizer

INF_REWARD = '''
CALLS = [0]


def every_other_inf(completion, answer, meta):
    """inf on every other call (deterministic), else a finite score."""
    CALLS[0] += 1
    return float("inf") if CALLS[0] % 2 else len(completion) / 100.0
'''


def base(tiny: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "train.eval_before=false", "train.eval_after=false", "train.steps=1",
            "train.threads=1", *extra]


def tree_hash(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def one_error(capsys, after_progress: bool = False) -> str:
    """The one error line (with `after_progress`, the step lines printed before it are allowed)."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [x for x in err if x.startswith("upslope: error: ")]
    assert "Traceback" not in "\n".join(err) and len(errors) == 1 and err[-1] == errors[0], err
    assert after_progress or len(err) == 1, err
    return errors[0]


@pytest.fixture(scope="module")
def run(tiny_model_path, tmp_path_factory) -> Path:
    """A finished 1-step run with its checkpoint."""
    run_dir = tmp_path_factory.mktemp("safety") / "run"
    assert main(["train", *base(tiny_model_path, run_dir)]) == 0
    return run_dir


# ---------------------------------------------------------------- export


def test_export_new_and_empty_targets_work_and_leave_nothing_beside(run, tmp_path, capsys):
    step = run / "checkpoints" / "step_000001"
    before = tree_hash(run)
    assert main(["export", str(step), str(tmp_path / "new")]) == 0
    (tmp_path / "empty").mkdir()
    assert main(["export", str(step), str(tmp_path / "empty")]) == 0
    for out in ("new", "empty"):
        assert (tmp_path / out / "config.json").exists()
        assert load_file(tmp_path / out / "model.safetensors").keys() == \
            load_file(step / "model" / "model.safetensors").keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "new"]  # no temp dirs left
    assert tree_hash(run) == before


def test_export_refuses_non_empty_target_and_cwd(run, tmp_path, capsys, monkeypatch):
    step = run / "checkpoints" / "step_000001"
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("my notes")
    assert main(["export", str(step), str(notes)]) == 2
    assert "--force" in one_error(capsys)
    assert (notes / "todo.txt").read_text() == "my notes" and len(list(notes.iterdir())) == 1
    monkeypatch.chdir(notes)
    for args in (["."], [".", "--force"], [str(tmp_path), "--force"]):
        assert main(["export", str(step), *args]) == 2
        one_error(capsys)
    assert (notes / "todo.txt").read_text() == "my notes" and len(list(notes.iterdir())) == 1


def test_export_force_replaces_a_previous_export_only(run, tmp_path, capsys):
    step = run / "checkpoints" / "step_000001"
    out = tmp_path / "model"
    assert main(["export", str(step), str(out)]) == 0
    (out / "stale.txt").write_text("from an older export")
    assert main(["export", str(step), str(out)]) == 2
    one_error(capsys)
    assert main(["export", str(step), str(out), "--force"]) == 0
    assert not (out / "stale.txt").exists() and (out / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    before = tree_hash(run)
    for target in (run, run / "checkpoints", step, step / "model"):  # the checkpoint or a directory holding it
        assert main(["export", str(step), str(target), "--force"]) == 2
        one_error(capsys)
    assert tree_hash(run) == before


# ---------------------------------------------------------------- checkpoints


def test_pruning_removes_only_checkpoints_upslope_wrote(tiny_model_path, tmp_path):
    model = load_model(tiny_model_path)
    tok = load_tokenizer(tiny_model_path)
    ckdir = tmp_path / "checkpoints"
    ckdir.mkdir()
    user = {"step_000000/notes.txt": "a user's folder named like a checkpoint",
            "step_notes/COMPLETE": "x", "step_1/COMPLETE": "1", ".tmp-step_mine/keep.txt": "keep",
            "step_000002_backup/COMPLETE": "2"}
    for rel, text in user.items():
        (ckdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (ckdir / rel).write_text(text)
    state = {"step": 0, "optimizer": {}, "scheduler": {}, "rng": ckpt.rng_state()}
    for step in (1, 2, 3):
        ckpt.save_checkpoint(ckdir, step, model, tok, {**state, "step": step}, "x: 1\n", keep_last=1)
    names = sorted(p.name for p in ckdir.iterdir())
    assert names == sorted({rel.split("/")[0] for rel in user} | {"step_000003", "latest"}), names
    for rel, text in user.items():
        assert (ckdir / rel).read_text() == text


def test_checkpoint_refuses_non_finite_weights_and_state(tiny_model_path, tmp_path):
    model = load_model(tiny_model_path)
    tok = load_tokenizer(tiny_model_path)
    ckdir = tmp_path / "checkpoints"
    state = {"step": 1, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}}, "scheduler": {},
             "rng": ckpt.rng_state()}
    first = ckpt.save_checkpoint(ckdir, 1, model, tok, state, "x: 1\n", keep_last=3)
    saved = tree_hash(first)
    bad_state = {**state, "step": 2, "optimizer": {"state": {0: {"exp_avg": torch.tensor([1.0, math.inf, 0.0])}}}}
    with pytest.raises(UpslopeError, match=r"non-finite.*optimizer\.state\.0\.exp_avg"):
        ckpt.save_checkpoint(ckdir, 2, model, tok, bad_state, "x: 1\n", keep_last=3)
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    with pytest.raises(UpslopeError, match="non-finite"):
        ckpt.save_checkpoint(ckdir, 2, model, tok, {**state, "step": 2}, "x: 1\n", keep_last=3)
    assert sorted(p.name for p in ckdir.iterdir()) == ["latest", "step_000001"]
    assert (ckdir / "latest").read_text().strip() == "step_000001" and tree_hash(first) == saved


def test_fresh_run_refuses_a_run_dir_holding_an_earlier_run(run, tiny_model_path, capsys):
    before = tree_hash(run)
    assert main(["train", *base(tiny_model_path, run)]) == 2
    assert "train.resume=latest" in one_error(capsys)
    assert tree_hash(run) == before


# ---------------------------------------------------------------- full and read-only disks


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A small tmpfs at `path` (root only): a disk that fills, or a read-only one."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_full_while_saving_keeps_the_previous_checkpoint(run, tiny_model_path, tmp_path, capsys):
    one = sum(p.stat().st_size for p in (run / "checkpoints" / "step_000001").rglob("*") if p.is_file())
    with tmpfs(tmp_path / "disk", f"{int(one * 1.5) // 1024}k") as disk:
        rd = disk / "run"
        rc = main(["train", *base(tiny_model_path, rd, "train.steps=3", "train.save_every=1", "train.keep_last=5")])
        line = one_error(capsys, after_progress=True)
        assert rc == 2 and "No space left on device" in line and "step_000002" in line, line
        ck = rd / "checkpoints"
        assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_000001"]  # no half-written step
        assert (ck / "latest").read_text().strip() == "step_000001"
        weights = load_file(ck / "step_000001" / "model" / "model.safetensors")
        assert all(bool(torch.isfinite(v).all()) for v in weights.values())
        ckpt.load_trainer_state(ck / "step_000001")


def test_read_only_run_dir_and_export_target(run, tiny_model_path, tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        assert main(["train", *base(tiny_model_path, ro / "run")]) == 2
        assert f"run_dir={ro / 'run'}" in one_error(capsys)
        assert main(["export", str(run / "checkpoints" / "step_000001"), str(ro / "out")]) == 2
        assert str(ro) in one_error(capsys)


# ---------------------------------------------------------------- non-finite rewards and gradients


def test_inf_reward_falls_back_and_weights_stay_finite(tiny_model_path, tmp_path, capsys):
    reward = tmp_path / "inf_reward.py"
    reward.write_text(INF_REWARD)
    rd = tmp_path / "run"
    assert main(["train", *base(tiny_model_path, rd, "train.steps=2", "optim.lr=1e-2", "rollout.n=4",
                                f"reward=[{{name: '{reward}:every_other_inf'}}]")]) == 0
    rows = metrics(rd)
    assert [r["reward_failures/every_other_inf"] for r in rows] == [4.0, 4.0]  # half of 8 samples a step
    assert all(math.isfinite(r["reward/mean"]) and math.isfinite(r["grad_norm"]) for r in rows)
    weights = load_file(rd / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert all(bool(torch.isfinite(v).all()) for v in weights.values())


def _learner_and_batch(tiny_model_path: str, tmp_path: Path, limit: int = 3):
    from upslope.train.learner.updater import Updater

    cfg = load_config(None, [f"model.name={tiny_model_path}", "train.precision=float32", "optim.lr=1e-2",
                             f"optim.max_nonfinite_steps={limit}", f"run_dir={tmp_path}"])
    learner = Updater.from_config(cfg, tiny_model_path, "cpu")
    b = build_batch([[1, 2, 3]] * 2, [[4, 5], [6, 7]], [[0.0, 0.0]] * 2, [0, 0], [False] * 2, pad_id=2)
    b.advantages = torch.tensor([1.0, -1.0])[:, None] * b.loss_mask
    return learner, b


def test_nonfinite_gradient_step_is_skipped_then_the_run_stops(tiny_model_path, tmp_path):
    from upslope.train.learner.objectives import LossOutputs, Objective

    class FunctionObjective(Objective):
        """This test's objective: a plain function of the policy's log-probs."""

        def __init__(self, fn):
            self.fn = fn

        def loss(self, out, mb, norms):
            return LossOutputs(self.fn(out.logprobs, mb, norms), {})

    learner, b = _learner_and_batch(tiny_model_path, tmp_path)
    params = lambda: [p.detach().clone() for p in learner.model.parameters()]  # noqa: E731

    def nan_loss(lp, mb, norms):
        return (lp * mb.loss_mask).sum() * math.nan

    def real_loss(lp, mb, norms):
        return -(lp * mb.advantages * mb.loss_mask).sum() / norms["num_tokens"]

    before = params()
    out = learner.update(b, 1, FunctionObjective(nan_loss))
    assert out["learner/nonfinite_skipped"] == 1.0
    assert all(torch.equal(x, y) for x, y in zip(before, params()))  # weights untouched
    assert not learner.optimizer.state or all(  # and no NaN in the optimiser state
        torch.isfinite(t).all() for s in learner.optimizer.state.values() for t in s.values()
        if isinstance(t, torch.Tensor) and t.is_floating_point())
    out = learner.update(b, 2, FunctionObjective(real_loss))  # a finite step updates and resets the count
    assert out["learner/nonfinite_skipped"] == 0.0
    assert any(not torch.equal(x, y) for x, y in zip(before, params()))
    learner.update(b, 3, FunctionObjective(nan_loss))
    learner.update(b, 4, FunctionObjective(nan_loss))
    with pytest.raises(UpslopeError, match="optim.max_nonfinite_steps=3"):
        learner.update(b, 5, FunctionObjective(nan_loss))
    assert all(bool(torch.isfinite(p).all()) for p in learner.model.parameters())


def test_diverging_run_stops_in_one_line_and_saves_only_finite_weights(tiny_model_path, tmp_path, capsys):
    """lr=1e30 blows the weights up after one step; every later gradient is NaN: each such step
    is skipped, and after optim.max_nonfinite_steps in a row the run stops with one line."""
    rd = tmp_path / "run"
    rc = main(["train", *base(tiny_model_path, rd, "train.steps=8", "train.precision=float32", "optim.lr=1e30",
                              "optim.grad_clip=0", "rollout.n=4", "train.save_every=1",
                              f"reward=[{{name: '{Path(__file__).parent / 'fixtures' / 'toy_rewards.py'}:long_text'}}]")])
    line = one_error(capsys, after_progress=True)
    assert rc == 2 and "optim.max_nonfinite_steps=3" in line, line
    rows = metrics(rd)
    assert [r["learner/nonfinite_skipped"] for r in rows] == [0.0, 1.0, 1.0]  # the 3rd skip raised in step 4
    for step in sorted((rd / "checkpoints").glob("step_*")):
        weights = load_file(step / "model" / "model.safetensors")
        assert all(bool(torch.isfinite(v).all()) for v in weights.values()), step
