"""`upslope train dist.learner_procs=N` (and `upslope.train(cfg)`): bad combinations are one error
line before any rank starts; a real 2-rank run (spawned by upslope, gloo, the tiny model, the HF engine) writes a
checkpoint with DCP shards and the gathered HF model, which one process resumes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_helpers import metrics

from upslope.cli import main

TINY_RUN = ["engine.name=hf", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=8",
            "train.eval_before=false", "train.eval_after=false", "log.progress=false", "log.plot=false",
            "log.tensorboard=false", "model.dtype=float32", "engine.dtype=float32", "train.precision=float32"]
TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


def test_unsupported_combination_is_one_line_before_any_rank_starts(tmp_path, capsys):
    rc = main(["train", f"run_dir={tmp_path / 'run'}", "dist.learner_procs=2", "optim.state_dtype=int8",
               "model.dtype=float32"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith("upslope: error: dist.strategy=fsdp: 8-bit AdamW moments")


def test_learner_procs_other_than_torchruns_world_size_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    rc = main(["train", f"run_dir={tmp_path / 'run'}", "dist.learner_procs=2", "dist.strategy=ddp"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "dist.learner_procs=2, but torchrun started 3 processes" in err and "\n" not in err


@pytest.mark.slow  # two spawned ranks and a resumed run: ~1-2 min on 2 busy cores
def test_two_rank_run_checkpoints_shards_and_resumes_in_one_process(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    args = ["train", f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN]
    assert main([*args, "train.steps=1", "dist.learner_procs=2"]) == 0
    step1 = run / "checkpoints" / "step_000001"
    assert (step1 / "sharded" / ".metadata").is_file() and any((step1 / "model").glob("*.safetensors"))
    assert main([*args, "train.steps=2", "train.resume=latest"]) == 0  # 2 -> 1
    steps = [r["step"] for r in metrics(run)]
    assert steps == [1, 2]
    assert (run / "checkpoints" / "step_000002" / "COMPLETE").is_file()


PAIRS = [{"prompt": f"Say something about {w}.", "chosen": f"Thank you! {w} is lovely.", "rejected": f"{w} whatever"}
         for w in ("apple", "river", "stone", "cloud", "green", "seven")]


@pytest.mark.slow  # two spawned ranks per trainer: ~1-2 min each on 2 busy cores
@pytest.mark.parametrize("command, extra, logged", [
    ("dpo", ["dpo.source=dataset", "dpo.pairs_per_step=4"], "pref/accuracy"),
    ("rm", ["rm.source=dataset", "rm.pairs_per_step=4", "rm.eval_pairs=2"], "rm/accuracy"),
    ("distill", ["distill.teacher=self", "distill.teacher_temperature=2.0", "distill.top_k=4"], "distill/rkl_topk"),
])
def test_pair_and_distill_trainers_run_on_two_ranks(tiny_model_path, tmp_path, command, extra, logged):
    """Through the command line: the trainer's step on 2 fsdp ranks (DPO's cached reference, the
    reward model's scalar head, the sharded teacher) logs its metrics and writes a sharded checkpoint."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    path = [f"{command}.path={pairs}"] if command in ("dpo", "rm") else []
    run = tmp_path / "run"
    assert main([command, f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN, *extra, *path,
                 "train.steps=1", "dist.learner_procs=2", "dist.strategy=fsdp"]) == 0
    (record,) = metrics(run)
    assert logged in record and record["loss"] != 0
    step1 = run / "checkpoints" / "step_000001"
    assert (step1 / "sharded" / ".metadata").is_file() and any((step1 / "model").glob("*.safetensors"))


@pytest.mark.slow  # two spawned ranks and a resumed run: ~1-2 min on 2 busy cores
def test_ppo_critic_checkpoints_its_shards_and_resumes_in_one_process(tiny_model_path, tmp_path):
    """PPO on 2 ranks: the critic's weights and AdamW state go into sharded/critic (trainer.pt says
    so), and one process resumes them."""
    run = tmp_path / "run"
    args = ["train", f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN, "algo.advantage.name=gae"]
    assert main([*args, "train.steps=1", "dist.learner_procs=2"]) == 0
    step1 = run / "checkpoints" / "step_000001"
    assert (step1 / "sharded" / "critic" / ".metadata").is_file()
    assert torch.load(step1 / "trainer.pt", weights_only=False)["critic"]["weights"] == "sharded"
    assert main([*args, "train.steps=2", "train.resume=latest"]) == 0  # 2 -> 1
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2] and all("critic/loss" in r for r in records)


@pytest.mark.slow  # a one-process run, then two spawned ranks resuming it: ~1-2 min on 2 busy cores
def test_lora_on_fsdp_resumes_a_one_process_adapter_and_exports_it(tiny_model_path, tmp_path, capsys):
    """LoRA with FSDP through the command line: a one-process LoRA checkpoint (the adapter alone)
    resumes on 2 ranks (each keeps its shards of the adapter and its AdamW state), whose checkpoint
    again holds only the adapter, gathered from the shards, and `upslope export` merges it into
    a plain model with the adapted model's outputs."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from upslope import lora
    from upslope.models import load_model

    run = tmp_path / "run"
    args = ["train", f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN, "lora.enabled=true",
            "lora.rank=4", "optim.lr=1e-2", f"reward=[{{name: '{TOY}:long_text'}}]"]  # rewards that differ
    assert main([*args, "train.steps=1"]) == 0
    assert main([*args, "train.steps=2", "train.resume=latest", "dist.learner_procs=2", "dist.strategy=fsdp"]) == 0
    step1, step2 = (run / "checkpoints" / f"step_00000{i}" for i in (1, 2))
    assert lora.is_adapter_dir(step2 / "model") and (step2 / "sharded" / ".metadata").is_file()
    assert not list((step2 / "model").glob("model*.safetensors"))  # no full model beside the adapter
    before, after = (load_file(s / "model" / lora.ADAPTER_WEIGHTS) for s in (step1, step2))
    assert before.keys() == after.keys()
    assert max(float((after[k] - before[k]).abs().max()) for k in after) > 1e-4  # step 2 trained on 2 ranks
    out = tmp_path / "merged"
    assert main(["export", str(step2), str(out)]) == 0
    ids = torch.randint(5, 2000, (2, 10), generator=torch.Generator().manual_seed(0))
    adapted = PeftModel.from_pretrained(load_model(tiny_model_path), str(step2 / "model")).eval()
    with torch.no_grad():
        assert torch.allclose(load_model(str(out)).eval()(input_ids=ids).logits, adapted(input_ids=ids).logits,
                              atol=1e-4)
    capsys.readouterr()


def test_python_api_checks_the_run_directory_as_the_command_line_does(tiny_model_path, tmp_path):
    """`upslope.train(cfg)` (still the function after the trainers are imported) refuses a run directory
    that holds a run before any work, as `upslope train` does."""
    import upslope
    import upslope.train.trainers.rl  # noqa: F401  (loading the package must not rebind upslope.train)
    from upslope.config import load_config
    from upslope.errors import ConfigError

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="holds an earlier run"):
        upslope.train(load_config(None, [f"model.name={tiny_model_path}", f"run_dir={run}", *TINY_RUN]))
