"""`upslope dpo` end to end on the tiny model: file pairs and on-policy pairs (HF engine), the
reference log-probs computed once per pair, exact resume, the recipes, and one-line errors."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from markers import IN_CI_SLOW_SET
import torch
from run_helpers import learning, metrics, trained
from safetensors.torch import load_file

from upslope.cli import main
from upslope.config import load_config
from upslope.train.trainers.dpo import DPOTrainer

ROOT = Path(__file__).resolve().parents[3]
TOY = ROOT / "tests" / "fixtures" / "toy_rewards.py"
PAIRS = [
    {"prompt": "What is 3 * 4?", "chosen": "12", "rejected": "7"},
    {"prompt": "What is 6 * 7?", "chosen": "42", "rejected": "The answer is 13"},
    {"prompt": [{"role": "user", "content": "What is 2 * 5?"}], "chosen": [{"role": "assistant", "content": "10"}],
     "rejected": [{"role": "assistant", "content": "25"}]},
    {"prompt": "What is 9 * 9?", "chosen": "81", "rejected": ""},
]


def tiny(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=4", "rollout.n=4",
            "rollout.max_new_tokens=6", "rollout.max_resample_rounds=0", "dpo.pairs_per_step=3",
            "train.eval_before=false", "train.eval_after=false", "train.micro_batch_tokens=512", "train.steps=2",
            "train.threads=1",
            *extra]


def file_args(tmp_path: Path) -> list[str]:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    return ["dpo.source=dataset", f"dpo.path={path}"]


def on_policy_args() -> list[str]:
    return [f"reward=[{{name: '{TOY}:long_text'}}]"]  # a reward that differs within every group of the tiny model



def run(overrides: list[str], instrument=None) -> DPOTrainer:
    trainer = DPOTrainer(load_config(None, overrides))
    try:
        if instrument:
            instrument(trainer)
        trainer.run()
    finally:
        trainer.close()
    return trainer


@pytest.mark.parametrize("source", ["dataset", "on_policy"])
def test_command_runs_two_steps(source, tiny_model_path, tmp_path):
    run_dir = tmp_path / "run"
    args = file_args(tmp_path) if source == "dataset" else on_policy_args()
    assert main(["dpo", *tiny(tiny_model_path, run_dir, *args)]) == 0
    log = metrics(run_dir)
    assert [r["step"] for r in log] == [1, 2]
    for r in log:
        assert {"loss", "pref/margin", "pref/accuracy", "pref/chosen_reward", "pref/rejected_reward",
                "pairs/built", "pairs/kept"} <= r.keys()
        assert math.isfinite(r["loss"]) and r["pairs/kept"] == 3
    # before the first update the policy is the reference: margin 0, loss log 2
    assert log[0]["loss"] == pytest.approx(math.log(2), abs=1e-4) and log[0]["pref/margin"] == pytest.approx(0, abs=1e-3)
    assert log[1]["loss"] != log[0]["loss"]
    if source == "on_policy":
        assert log[0]["pairs/built"] == 4 and "reward/mean" in log[0]
    assert (run_dir / "checkpoints" / "step_000002" / "model" / "config.json").exists()


def count_calls(trainer: DPOTrainer) -> None:
    """Record, per step, the learner's reference log-prob passes and its policy forwards (with
    or without gradient) through a forward hook on the real decoder."""
    from upslope.train.learner.logprobs import fast_head_matches

    learner = trainer.updater
    assert fast_head_matches(learner.model)  # the one-time head check (a no-grad forward), before counting
    trainer.counts = []
    now = {"ref_passes": 0, "policy_grad": 0, "policy_nograd": 0}
    learner.model.get_decoder().register_forward_hook(
        lambda *a: now.__setitem__("policy_grad" if torch.is_grad_enabled() else "policy_nograd",
                                   now["policy_grad" if torch.is_grad_enabled() else "policy_nograd"] + 1))
    logprobs, step = learner.logprobs, trainer.step

    def counted_logprobs(batch, *, temperature, reference=False):
        now["ref_passes"] += int(reference)
        return logprobs(batch, temperature=temperature, reference=reference)

    def counted_step(s):
        now.update(ref_passes=0, policy_grad=0, policy_nograd=0)
        out = step(s)
        trainer.counts.append(dict(now))
        return out

    learner.logprobs, trainer.step = counted_logprobs, counted_step


def test_file_pairs_reference_computed_once_before_the_first_update(tiny_model_path, tmp_path):
    """4 pairs, 2 per step, 2 epochs per batch, 3 steps: the policy runs without gradient only in
    step 1 (the reference pass over every pair, before any update), never again."""
    t = run(tiny(tiny_model_path, tmp_path / "r", *file_args(tmp_path), "dpo.pairs_per_step=2",
                 "train.epochs_per_batch=2", "train.steps=3"), count_calls)
    first, *later = t.counts
    assert first["policy_nograd"] > 0 and first["policy_grad"] > 0
    assert all(c["policy_nograd"] == 0 and c["policy_grad"] > 0 and c["ref_passes"] == 0 for c in later)
    assert t.updater._reference is None  # no second model
    assert sorted(t.ref_cache) == [0, 1, 2, 3]
    for chosen, rejected in t.ref_cache.values():
        assert (chosen < 0).all() and (rejected < 0).all()


@pytest.mark.parametrize("loss, passes", [("sigmoid", 1), ("simpo", 0)])
def test_on_policy_reference_once_per_rollout_batch(loss, passes, tiny_model_path, tmp_path):
    """With 2 epochs per batch the frozen reference still runs once per step (and SimPO loads none)."""
    t = run(tiny(tiny_model_path, tmp_path / "r", *on_policy_args(), f"dpo.loss.name={loss}",
                 "train.epochs_per_batch=2"), count_calls)
    assert [c["ref_passes"] for c in t.counts] == [passes, passes]
    assert all(c["policy_nograd"] == 0 for c in t.counts)
    assert (t.updater._reference is not None) == bool(passes)


def test_file_pairs_resume_is_exact(tiny_model_path, tmp_path):
    """2 steps == 1 step, stop, resume, 1 step (the cached reference log-probs come from the checkpoint)."""
    common = [*file_args(tmp_path), "dpo.pairs_per_step=2", "train.deterministic=true",
              "optim.lr=1e-3", "train.save_every=1"]
    run(tiny(tiny_model_path, tmp_path / "straight", *common))
    run(tiny(tiny_model_path, tmp_path / "split", *common, "train.stop_after=1"))
    run(tiny(tiny_model_path, tmp_path / "split", *common, "train.resume=latest"))
    a = load_file(tmp_path / "straight" / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    b = load_file(tmp_path / "split" / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert learning(metrics(tmp_path / "straight")) == learning(metrics(tmp_path / "split"))


@pytest.mark.parametrize("recipe", ["dpo", *(pytest.param(r, marks=IN_CI_SLOW_SET)  # ~3 s each
                                             for r in ["ipo", "simpo", "sro", "bro"])])
def test_recipes_run_two_steps(recipe, tiny_model_path, tmp_path):
    cfg = load_config(ROOT / "recipes" / f"{recipe}.yaml", tiny(tiny_model_path, tmp_path, *on_policy_args()))
    assert cfg.dpo.loss.name == {"dpo": "sigmoid"}.get(recipe, recipe) and cfg.dpo.source == "on_policy"
    trained(DPOTrainer(cfg))
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in metrics(tmp_path))


@pytest.mark.parametrize("args, expected", [
    (["dpo.source=dataset"], "dpo.path: dpo.source=dataset needs a file of pairs"),
    (["dpo.path=x.jsonl"], "pairs are read from a file only with dpo.source=dataset"),
    (["dpo.sorce=dataset"], "did you mean 'dpo.source'"),
    (["dpo.loss.name=sigmod"], "did you mean 'sigmoid'"),
    (["dpo.loss.options={bta: 0.5}"], "dpo.loss.options.bta: unknown option for preference_loss 'sigmoid' "
                                      "(did you mean 'beta'?)"),
    (["dpo.loss.options={beta: -1}"], "dpo.loss.options.beta: Input should be greater than 0"),
    (["rollout.n=1"], "on-policy pairs compare completions of the same prompt, so rollout.n >= 2"),
    (["algo.kl_coef=0.1"], "set algo.kl_coef=0"),
    (["train.updates_per_batch=4", "dpo.pairs_per_step=2"], "cannot split 2 pairs into more mini-batches"),
])
def test_bad_input_is_one_clear_line(args, expected, capsys, smollm_path):
    # the commands use the default model: converted by the session fixture, not inside the captured command
    assert main(["dpo", "log.progress=false", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("upslope: error:") and expected in err[0], err


def test_bad_pair_row_is_one_line_naming_file_line_and_field(tiny_model_path, tmp_path, capsys):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(PAIRS[0]) + "\n" + json.dumps({"prompt": "q", "chosen": "a"}) + "\n")
    assert main(["dpo", *tiny(tiny_model_path, tmp_path / "r", "dpo.source=dataset", f"dpo.path={path}")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}:2: field 'rejected' missing (dpo.rejected_field" in err[0], err
