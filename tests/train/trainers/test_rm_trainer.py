"""`upslope rm` end to end on the tiny model: pairwise accuracy rises on a separable toy
preference set, the checkpoint loads as an HF sequence-classification model and scores as
the trainer does, resume is exact, on-policy pairs from a reward (the recipe), one-line errors. The on-policy
resume test is marked slow (~18 s here under load)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_helpers import learning, metrics
from safetensors.torch import load_file

from upslope.cli import main
from upslope.config import load_config
from upslope.train.trainers.rm import RMTrainer

ROOT = Path(__file__).resolve().parents[3]
TOY = ROOT / "tests" / "fixtures" / "toy_rewards.py"
WORDS = ["apple", "river", "stone", "cloud", "green", "seven", "table", "light", "music", "paper", "north", "glass"]


def toy_pairs(n: int) -> list[dict]:
    """Separable by construction: the chosen reply is polite ("Thank you ..."), the rejected one is not."""
    out = []
    for i in range(n):
        a, b = WORDS[i % len(WORDS)], WORDS[(3 * i + 1) % len(WORDS)]
        out.append({"prompt": f"Say something about {a}.", "chosen": f"Thank you! {a} and {b} are lovely.",
                    "rejected": f"{b} {a} whatever"})
    return out


def tiny(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=4", "rollout.n=4",
            "rollout.max_new_tokens=6", "train.micro_batch_tokens=512", "train.threads=1", "train.precision=float32",
            "model.dtype=float32", "optim.lr=1e-3", *extra]


def file_args(tmp_path: Path, n: int = 40, held: int = 16) -> list[str]:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in toy_pairs(n)))
    return ["rm.source=dataset", f"rm.path={path}", f"rm.eval_pairs={held}", "rm.pairs_per_step=8"]



def run(overrides: list[str]) -> tuple[RMTrainer, dict]:
    trainer = RMTrainer(load_config(None, overrides))
    try:
        results = trainer.run()
    finally:
        trainer.close()
    return trainer, results


def test_pairwise_accuracy_rises_and_the_checkpoint_is_an_hf_reward_model(tiny_model_path, tmp_path):
    """Held-out pairwise accuracy goes from chance (every score 0: the head starts at zero) to
    above 0.9; the saved model loads with AutoModelForSequenceClassification and gives the
    trainer's own scores."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run_dir = tmp_path / "rm"
    trainer, results = run(tiny(tiny_model_path, run_dir, *file_args(tmp_path), "train.steps=8"))
    assert results["before"]["accuracy"] == 0.5  # all ties: half credit each
    assert results["after"]["accuracy"] >= 0.9, results["after"]
    train = [r["rm/accuracy"] for r in metrics(run_dir) if "rm/accuracy" in r]
    assert len(train) == 8 and train[-1] > train[0]

    model_dir = run_dir / "checkpoints" / "step_000008" / "model"
    net = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    held = trainer.held_out
    assert held is not None
    with torch.no_grad():
        hf = net(input_ids=held.input_ids, attention_mask=held.attention_mask.long()).logits.squeeze(-1)
        ours = trainer.updater.model.eval().sequence_scores(held.input_ids, held.attention_mask)
    assert net.config.num_labels == 1 and tok.pad_token_id == net.config.pad_token_id
    torch.testing.assert_close(hf, ours, rtol=1e-5, atol=1e-5)


def test_gradient_checkpointing_gives_the_same_update(tiny_model_path, tmp_path):
    """train.grad_checkpointing (on by default) recomputes layers in backward: the same weights after 2 steps."""
    weights = []
    for gc in ("true", "false"):
        run_dir = tmp_path / f"gc_{gc}"
        run(tiny(tiny_model_path, run_dir, *file_args(tmp_path, n=20, held=4), "train.steps=2",
                 f"train.grad_checkpointing={gc}", "train.eval_before=false", "train.eval_after=false"))
        weights.append(load_file(run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    a, b = weights
    assert a["score.weight"].abs().max() > 0
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("source", ["dataset", pytest.param("on_policy", marks=pytest.mark.slow)])
def test_resume_is_exact(source, tiny_model_path, tmp_path):
    """rm for 4 steps == rm for 2, stop, resume, 2 more: same weights and metrics (on-policy: the
    held-out pairs built before step 1 come back from the checkpoint for the final evaluation)."""
    pairs = (file_args(tmp_path, n=24, held=8) if source == "dataset" else
             [f"reward=[{{name: '{TOY}:long_text'}}]", "rm.eval_pairs=4", "eval.limit=8", "train.eval_after=true"])
    common = [*pairs, "train.steps=4", "train.save_every=2", "train.deterministic=true", "rm.pairs_per_step=4",
              "train.eval_every=0"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(tiny(tiny_model_path, straight, *common))
    run(tiny(tiny_model_path, split, *common, "train.stop_after=2"))
    trainer, _ = run(tiny(tiny_model_path, split, *common, "train.resume=latest"))
    assert trainer.start_step == 2
    a = load_file(straight / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and "score.weight" in a
    assert all(torch.equal(a[k], b[k]) for k in a)

    assert learning(metrics(straight)) == learning(metrics(split))
    if source == "on_policy":
        assert [r["step"] for r in metrics(split) if "eval/rm_accuracy" in r] == [0, 4]


@pytest.mark.parametrize("extra, message", [
    (["rm.source=dataset"], "rm.path: rm.source=dataset needs a file of pairs"),
    (["lora.enabled=true"], "lora.enabled: upslope rm trains every weight"),
    (["rm.source=dataset", "rm.path=PAIRS", "rm.eval_pairs=40"], "rm.eval_pairs=40: "),
    (["rm.source=dataset", "rm.path=PAIRS", "rm.chosen_field=better"], "field 'better' missing (rm.chosen_field"),
    (["rm.source=dataset", "rm.path=PAIRS", "rm.eval_pairs=2", "rollout.max_prompt_tokens=4",
      "rollout.drop_long_prompts=true"], "no training pair is left after dropping prompts"),
])
def test_bad_input_is_one_line(tiny_model_path, tmp_path, capsys, extra, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in toy_pairs(10)))
    extra = [e.replace("PAIRS", str(path)) for e in extra]
    assert main(["rm", *tiny(tiny_model_path, tmp_path / "bad", *extra)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("upslope: error: ")]  # warnings may come before it
    assert len(errors) == 1 and errors[0] == err[-1] and message in errors[0], err


def test_the_rm_recipe_runs_on_policy_pairs(tiny_model_path, tmp_path):
    """recipes/rm.yaml (on-policy pairs labelled by the strict reward) for 2 steps on the tiny model; a
    reward the tiny model's samples differ in stands in for the strict one (always 0 for it). Each
    step builds its pairs from rollout.n samples per prompt; the held-out pairs, built once from
    the evaluation prompts, serve the evaluations before and after."""
    run_dir = tmp_path / "r"
    cfg = load_config(ROOT / "recipes" / "rm.yaml", tiny(tiny_model_path, run_dir, "train.steps=2",
                                                         f"reward=[{{name: '{TOY}:long_text'}}]", "rm.eval_pairs=4",
                                                         "rm.pairs_per_step=4", "eval.limit=8", "train.eval_every=0"))
    assert cfg.rm.source == "on_policy" and cfg.rollout.n == 4
    trainer = RMTrainer(cfg)
    try:
        results = trainer.run()
    finally:
        trainer.close()
    assert [m["pairs/kept"] for m in metrics(run_dir) if "pairs/kept" in m] == [4.0, 4.0]
    assert results["before"]["pairs"] == results["after"]["pairs"] == 4
    assert trainer.held_out is not None and trainer.held_out.size == 8
    assert (run_dir / "checkpoints" / "step_000002" / "model" / "config.json").is_file()
