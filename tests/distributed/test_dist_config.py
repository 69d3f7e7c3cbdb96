"""The dist section: defaults keep today's single-process learner, and a combination the
sharded learner cannot run is one config error line (checked before any process starts)."""
from __future__ import annotations

import pytest
import torch

from upslope.config import load_config
from upslope.distributed.shard import check_combination
from upslope.errors import ConfigError

CPU = torch.device("cpu")


def check(*overrides: str) -> None:
    """check_combination on the default config (fp32 weights, whatever this machine's auto picks) plus `overrides`."""
    cfg = load_config(None, ["model.dtype=float32", "engine.dtype=float32", "train.precision=float32", *overrides])
    check_combination(cfg.dist, cfg.optim, cfg.model, CPU)


def test_defaults_are_one_process():
    cfg = load_config(None, [])
    d = cfg.dist
    assert (d.learner_procs, d.strategy, d.cpu_offload, d.backend) == (1, "fsdp", False, "auto")
    check()


@pytest.mark.parametrize("overrides, words", [
    (["optim.state_dtype=int8"], "8-bit AdamW moments"),
    (["model.dtype=bfloat16", "train.precision=bfloat16"], "8-bit AdamW moments"),  # auto: int8 with bf16 weights
    (["dist.cpu_offload=true"], "GPU learner"),
    (["dist.backend=nccl"], "needs GPUs"),
])
def test_unsupported_combination_is_one_line(overrides, words):
    with pytest.raises(ConfigError) as err:
        check("dist.learner_procs=2", *overrides)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["dist.strategy=ddp", "optim.state_dtype=int8"], ["dist.strategy=ddp", "lora.enabled=true"], ["lora.enabled=true"],
    ["optim.state_dtype=bfloat16", "model.dtype=bfloat16", "train.precision=bfloat16"],
    ["optim.state_dtype=int8"],  # one process: every optimiser path as today
])
def test_supported_combinations_pass(overrides):
    procs = [] if overrides == ["optim.state_dtype=int8"] else ["dist.learner_procs=2"]
    check(*procs, *overrides)


def test_unknown_dist_key_is_an_error():
    with pytest.raises(ConfigError, match="dist"):
        load_config(None, ["dist.procs=2"])


def test_stale_samples_are_bounded_by_default_and_warned_about_when_the_user_turns_that_off():
    from upslope.train.pipeline import staleness_warning

    sync = load_config(None, ["dist.rollout_workers=1"])
    assert sync.algo.old_policy == "learner" and sync.algo.correction is None and staleness_warning(sync) is None
    # the default: the loss's ratio against the sampler's log-probs, so the clip bounds stale samples
    stale = load_config(None, ["dist.rollout_workers=1", "pipeline.max_staleness=2"])
    assert stale.algo.old_policy == "sampler" and stale.algo.correction is None
    assert staleness_warning(stale) is None
    # token-level TIS instead
    tis = load_config(None, ["pipeline.max_staleness=2", "pipeline.stale_correction=token"])
    assert tis.algo.old_policy == "learner"
    assert (tis.algo.correction.level, tis.algo.correction.cap, tis.algo.correction.mask_low) == ("token", 2.0, None)
    # what the user set is kept as it is
    own = load_config(None, ["pipeline.max_staleness=1", "pipeline.stale_correction=token",
                             "algo.correction={level: sequence, cap: 3.0}"])
    assert (own.algo.correction.level, own.algo.correction.cap) == ("sequence", 3.0)
    mine = load_config(None, ["pipeline.max_staleness=1", "algo.old_policy=learner"])
    assert mine.algo.old_policy == "learner"
    # turned off: nothing bounds them, one warning line, and the setting it names silences it again
    off = load_config(None, ["dist.rollout_workers=1", "pipeline.max_staleness=2",
                             "pipeline.stale_correction=uncorrected"])
    assert off.algo.old_policy == "learner" and off.algo.correction is None
    note = staleness_warning(off)
    assert note is not None and "\n" not in note and "max_staleness=2" in note
    suggested = note.split("set ", 1)[1].split(" (the default)")[0]
    fixed = load_config(None, ["dist.rollout_workers=1", "pipeline.max_staleness=2", suggested])
    assert fixed.algo.old_policy == "sampler" and staleness_warning(fixed) is None
    assert staleness_warning(mine) is not None  # the user's own choice, unbounded: still said once
