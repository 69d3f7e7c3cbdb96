"""LoRA training end to end on the tiny model: `train lora.enabled=true` runs, its checkpoint
holds only a small adapter, resume is exact, export and merge-on-load round-trip, and after a
LoRA GRPO step both engines sample from the learner's merged weights."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from markers import IN_CI_SLOW_SET
import torch
from run_helpers import learning, metrics, trained
from safetensors.torch import load_file

from upslope import lora
from upslope.rollout.plugin import single_turn
from upslope.cli import main
from upslope.config import load_config
from upslope.data.types import Example
from upslope.models import load_model
from upslope.registry import ADVANTAGES
from upslope.engine import SamplingParams
from upslope.train import stages
from upslope.train.learner.objectives import RLObjective
from upslope.train.learner.updater import Updater
from upslope.train.trainers.rl import Trainer

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


def overrides(tiny_model_path: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=4", "rollout.n=4",
            "rollout.max_new_tokens=8", "train.eval_before=false", "train.eval_after=false",
            "train.micro_batch_tokens=512", "lora.enabled=true", "lora.rank=4", "optim.lr=2e-2",
            "train.steps=2", "train.deterministic=true", "train.threads=1", "train.seed=5",
            f"reward=[{{name: '{TOY}:long_text'}}]", *extra]


@pytest.fixture(scope="module")
def straight(tiny_model_path, tmp_path_factory) -> Path:
    """`upslope train lora.enabled=true`, 2 steps, through the command line."""
    run = tmp_path_factory.mktemp("lora") / "straight"
    assert main(["train", *overrides(tiny_model_path, run)]) == 0
    return run


def rows(run: Path) -> list[dict]:
    return learning(metrics(run))


def test_train_with_lora_runs_and_checkpoints_only_a_small_adapter(straight, tiny_model_path):
    assert [r["step"] for r in rows(straight)] == [1, 2]
    model_dir = straight / "checkpoints" / "step_000002" / "model"
    assert lora.is_adapter_dir(model_dir) and not (model_dir / "model.safetensors").exists()
    adapter = load_file(model_dir / lora.ADAPTER_WEIGHTS)
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert any(t.abs().max() > 0 for k, t in adapter.items() if ".lora_B." in k)  # it trained
    base_bytes = (Path(tiny_model_path) / "model.safetensors").stat().st_size
    assert (model_dir / lora.ADAPTER_WEIGHTS).stat().st_size < base_bytes / 50
    assert (straight / "checkpoints" / "step_000002" / "trainer.pt").exists()


def test_resume_with_lora_is_exact(straight, tiny_model_path, tmp_path):
    """2 steps == 1 step, stop, resume, 1 step: the same adapter bitwise and the same metrics."""
    split = tmp_path / "split"
    for extra in (["train.stop_after=1"], ["train.resume=latest"]):
        trained(Trainer(load_config(None, overrides(tiny_model_path, split, *extra))))
    a = load_file(straight / "checkpoints" / "step_000002" / "model" / lora.ADAPTER_WEIGHTS)
    b = load_file(split / "checkpoints" / "step_000002" / "model" / lora.ADAPTER_WEIGHTS)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert rows(straight) == rows(split)


def error_lines(capsys) -> list[str]:
    """stderr without the model loaders' progress bars."""
    return [x for x in capsys.readouterr().err.splitlines() if x.strip() and not x.startswith("Loading weights")]


def test_resume_with_a_different_lora_setting_is_one_line(straight, tiny_model_path, tmp_path, capsys):
    ckpt = straight / "checkpoints" / "step_000002"
    base = overrides(tiny_model_path, tmp_path / "r", f"train.resume={ckpt}", "train.steps=3")
    assert main(["train", *base, "lora.enabled=false"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "checkpoint holds a LoRA adapter, but this run trains the full model" in err[0], err
    assert main(["train", *base, "lora.rank=8"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "the saved adapter (rank 4" in err[0] and "differs from lora.* (rank 8" in err[0], err


def test_export_and_merge_on_load_round_trip(straight, tiny_model_path, tmp_path, capsys):
    """`upslope export` writes a plain HF model with the adapter model's outputs; `eval` on the
    export and directly on the checkpoint (merged on load) give the same samples."""
    from peft import PeftModel

    ckpt = straight / "checkpoints" / "step_000002"
    out = tmp_path / "merged"
    assert main(["export", str(ckpt), str(out)]) == 0
    assert "LoRA adapter merged" in capsys.readouterr().out
    assert (out / "config.json").exists() and (out / "tokenizer_config.json").exists()
    assert not lora.is_adapter_dir(out)
    merged = load_model(str(out)).eval()
    adapted = PeftModel.from_pretrained(load_model(tiny_model_path), str(ckpt / "model")).eval()
    ids = torch.randint(5, 2000, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-4)
        assert (load_model(tiny_model_path)(input_ids=ids).logits - want).abs().max() > 1e-3

    common = ["engine.name=hf", "eval.limit=4", "log.progress=false", f"model.cache_dir={tmp_path / 'cache'}"]
    samples = {}
    for label, name in (("export", out), ("checkpoint", ckpt)):
        assert main(["eval", f"model.name={name}", f"run_dir={tmp_path / label}", *common]) == 0
        samples[label] = [json.loads(x)["completion"] for x in (tmp_path / label / "eval_samples.jsonl").open()]
    capsys.readouterr()
    assert samples["export"] == samples["checkpoint"] and len(samples["export"]) == 4
    assert len(list((tmp_path / "cache" / "models").glob("merged-*"))) == 1  # merged once, cached


def test_export_rejects_what_is_not_a_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "not a checkpoint" in err[0], err
    assert main(["export", str(tmp_path)]) == 2
    assert "usage: upslope export CHECKPOINT_DIR OUT_DIR" in capsys.readouterr().err


@pytest.mark.parametrize("engine_name, targets", [
    ("hf_engine", "all"),
    pytest.param("vllm_engine", "all", marks=IN_CI_SLOW_SET),  # vLLM with LoRA: ~25 s
    pytest.param("vllm_engine", "q_proj", marks=IN_CI_SLOW_SET)])
def test_engine_samples_from_the_learners_merged_weights_after_a_lora_step(
        engine_name, targets, request, tiny_model_path, tokenizer, encode_chat, restore_weights):
    """One LoRA GRPO step, then the partial merged push: the engine's log-probs of its own samples
    equal the learner's (fp32 HF engine: tightly; bf16 vLLM: within bf16 noise), and differ from
    them before the push. With only q_proj adapted, vLLM's fused q/k/v tensor still comes out whole."""
    engine = request.getfixturevalue(engine_name)
    bf16 = engine_name == "vllm_engine"
    cfg = load_config(None, [f"model.name={tiny_model_path}", "lora.enabled=true", "optim.lr=0.15",
                             f"train.precision={'bfloat16' if bf16 else 'float32'}",
                             *([] if targets == "all" else [f"lora.target_modules=[{targets}]"])])
    torch.manual_seed(0)
    learner = Updater.from_config(cfg, tiny_model_path, "cpu")
    objective = RLObjective.from_config(cfg)
    questions = ["What is 3 * 4?", "Name a colour.", "Count to three.", "Say hi."]
    prompts = encode_chat(questions)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=1)
    pad = tokenizer.pad_token_id
    with restore_weights(engine):
        batch = single_turn(engine, prompts, [Example(prompt=q) for q in questions], params, pad)
        batch.rewards = torch.tensor([len(m["completion"]) / 10.0 for m in batch.meta])
        batch = stages.advantage(batch, ADVANTAGES.bind("grpo"))
        learner.update(batch, 1, objective)

        def gap() -> float:
            b = single_turn(engine, prompts, [Example(prompt=q) for q in questions], params, pad)
            return float(((learner.logprobs(b, temperature=1.0) - b.sampler_logprobs).abs() * b.loss_mask).sum() / b.loss_mask.sum())

        stale = gap()
        pushed = dict(learner.named_weights())
        engine.update_weights(pushed.items())
        synced = gap()
    assert "model.embed_tokens.weight" not in pushed  # a partial update: only what the adapter changes
    tol = 0.01 if bf16 else 1e-4
    assert synced < tol and stale > 4 * tol, (stale, synced)  # seen: hf 4e-7 vs 0.25; vllm 2e-3 vs 0.31 (q: 0.06)
