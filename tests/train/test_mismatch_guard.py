"""The mismatch guard: a run whose engine does not sample from the model the learner trains says so in
one line at its first steps. Provoked for real: an engine plugin (from a user file) whose weight sync
drops every tensor, so from the second step the engine samples from the initial weights."""
from __future__ import annotations

from pathlib import Path

from run_helpers import metrics

from upslope.cli import main
from upslope.train.guards import mismatch_warning

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"
STALE_ENGINE = '''
from upslope.registry import ENGINES
from upslope.rollout.hf import HFEngine


class StaleEngine(HFEngine):
    def update_weights(self, named_tensors):
        for _ in named_tensors:  # takes the tensors, keeps none of them
            pass
        self.version += 1


@ENGINES.register("stale_hf", copies_policy=True)
def stale_hf(cfg, ctx):
    """An HF engine whose weight sync drops every tensor (a broken sync, for the guard's test)."""
    return StaleEngine(ctx.model_path, ctx.tokenizer, dtype="float32", threads=ctx.threads)
'''


def run(tiny_model_path: str, run_dir: Path, engine: str, plugins: list[str], capsys) -> tuple[list[float], str]:
    status = main(["train", f"model.name={tiny_model_path}", f"engine.name={engine}", f"run_dir={run_dir}",
                   f"plugins={plugins}", "train.steps=2", "train.eval_before=false", "train.eval_after=false",
                   "log.progress=false", "log.plot=false", "log.tensorboard=false", "train.precision=float32",
                   "model.dtype=float32", "engine.dtype=float32", "optim.lr=3e-2", "rollout.prompts_per_step=4",
                   "rollout.n=4", "rollout.max_new_tokens=8", "train.threads=1", "train.skip_zero_advantage=false",
                   f"reward=[{{name: '{TOY}:long_text'}}]"])
    assert status == 0
    rows = metrics(run_dir)
    return [r["mismatch"] for r in rows], capsys.readouterr().err


def test_a_weight_sync_that_drops_weights_is_said_at_the_second_step(tiny_model_path, tmp_path, capsys):
    plugin = tmp_path / "stale_engine.py"
    plugin.write_text(STALE_ENGINE)
    mismatch, err = run(tiny_model_path, tmp_path / "stale", "stale_hf", [str(plugin)], capsys)
    assert mismatch[0] < 1e-3 < mismatch[1]  # the same model at step 1; the engine left behind at step 2
    text = " ".join(err.split())  # (the console wraps long lines to its width)
    assert text.count("do not compute the same model") == 1, err
    assert "step 2: the sampler's and the learner's log-probs" in text and "after the first weight push" in text


def test_a_sound_run_says_nothing(tiny_model_path, tmp_path, capsys):
    mismatch, err = run(tiny_model_path, tmp_path / "sound", "hf", [], capsys)
    assert max(mismatch) < 1e-3 and "do not compute the same model" not in " ".join(err.split())


def test_the_limits_by_precision_and_step():
    assert mismatch_warning(1, 0, 0.005, "float32", "float32") is None
    assert "before any update" in mismatch_warning(1, 0, 0.05, "float32", "float32")
    assert mismatch_warning(1, 0, 0.05, "bfloat16", "bfloat16") is None  # bf16 rounding
    assert "after the first weight push" in mismatch_warning(2, 0, 0.5, "bfloat16", "float32")
    assert mismatch_warning(3, 0, 5.0, "float32", "float32") is None  # later: staleness and updates explain more
    assert mismatch_warning(12, 10, 5.0, "float32", "float32") is not None  # a resumed run's first steps
