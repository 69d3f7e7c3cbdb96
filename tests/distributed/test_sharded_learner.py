"""The sharded learner on real processes (2 ranks, gloo, the tiny model): after 3 updates of
the same batch, DDP and FSDP2 give the losses, gradients and weights of one process (to float32
rounding), for a LoRA adapter too, the weight push streams one full tensor at a time from the
shards, and DCP checkpoints resume on another number of processes (1 -> 2 and 2 -> 1) to the
same 4th update. One spawned group runs every variant (module-scoped)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shard_worker
from shard_worker import max_diff
from upslope.distributed import group

pytestmark = pytest.mark.slow  # two spawned ranks load torch and transformers, then 3 x 4 updates: ~60 s

# (strategy, extra overrides): upslope's AdamW with bf16 moments runs on each FSDP shard's local tensor
# LoRA: each decoder layer's FSDP unit holds its frozen base weights and its adapter; with a KL term the
# reference is the same sharded model with the adapter switched off (through the FSDP root's forward)
LORA = ["lora.enabled=true", "lora.rank=4", "algo.kl_coef=0.1"]
VARIANTS = {"ddp": ["ddp"], "fsdp": ["fsdp"], "fsdp_bf16_moments": ["fsdp", "optim.state_dtype=bfloat16"],
            "fsdp_lora": ["fsdp", *LORA], "fsdp_rft": ["fsdp", shard_worker.SFT]}  # rft: SFT loss, 2 x 2 passes
# fp32: the rounding of gradient sums taken in another order (weights are O(0.1), lr 1e-3, Adam's eps 1e-4).
# bf16 moments: such a difference may round a moment to the neighbouring bf16 value, which moves that
# update by up to lr * 2^-7 (1 bf16 ulp relative, doubled through the ratio m / sqrt(v)): 4 updates, 3e-5.
TOLERANCE = {"ddp": 1e-6, "fsdp": 1e-6, "fsdp_bf16_moments": 3e-5, "fsdp_lora": 1e-6, "fsdp_rft": 1e-6}


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory, one_torch_thread) -> Path:
    """out/one/<variant>: one process (in this one); out/two/<variant>: two spawned ranks, each
    also resuming from the one-process checkpoint (1 -> 2)."""
    out = tmp_path_factory.mktemp("sharded")
    for name, (strategy, *extra) in VARIANTS.items():
        shard_worker.run(tiny_model_path, strategy, str(out / "one" / name), str(out / "one" / name / "ckpt"), *extra)
    resume = {name: str(out / "one" / name / "ckpt") for name in VARIANTS}
    group.spawn(shard_worker.run_variants, 2, tiny_model_path, str(out / "two"), resume, VARIANTS)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_ranks_update_like_one_process(runs, variant, tiny_state_dict):
    one = torch.load(runs / "one" / variant / "result.pt")
    two = torch.load(runs / "two" / variant / "result.pt")
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-6, abs=1e-6)  # SFT's losses are ~10: relative
    assert max_diff(two["grads"], one["grads"]) < TOLERANCE[variant]
    assert max_diff(two["weights"], one["weights"]) < TOLERANCE[variant]
    assert max_diff(two["pushed"], one["pushed"]) < TOLERANCE[variant]  # what the engine gets (LoRA: merged)
    moved = max(float((one["pushed"][k] - tiny_state_dict[k]).abs().max()) for k in one["pushed"])
    assert moved > 1e-3  # the weights did change: the equality is not of untouched weights


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_weight_push_holds_one_full_tensor_at_a_time(runs, variant):
    """The push from the shards gathers one parameter (LoRA: one merged weight) at a time: while
    the engine takes a tensor, no earlier pushed tensor is still alive, and no tensor is a view
    into a larger gathered buffer, so a rank never holds more than its shards plus one full tensor."""
    two = torch.load(runs / "two" / variant / "result.pt")
    assert two["most_alive"] == 1
    assert two["most_bytes"] == two["largest"] < two["total"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_resume_one_process_checkpoint_on_two_ranks(runs, variant):
    one = torch.load(runs / "one" / variant / "resumed.pt")  # 1 -> 1: the reference 4th update
    two = torch.load(runs / "two" / variant / "resumed.pt")  # 1 -> 2
    assert max_diff(two["loaded"], one["loaded"]) == 0.0
    assert max_diff(two["weights"], one["weights"]) < TOLERANCE[variant]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_resume_two_rank_checkpoint_in_one_process(runs, variant, tiny_model_path, tmp_path):
    """2 -> 1: the optimiser state comes back too, so the 4th update equals the uninterrupted one."""
    strategy, *extra = VARIANTS[variant]
    shard_worker.resume(tiny_model_path, strategy, str(tmp_path), str(runs / "two" / variant / "ckpt"), *extra)
    two = torch.load(runs / "two" / variant / "result.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    reference = torch.load(runs / "one" / variant / "resumed.pt")
    assert max_diff(resumed["loaded"], two["weights"]) == 0.0
    assert max_diff(resumed["weights"], reference["weights"]) < TOLERANCE[variant]
