"""The reward stage with the real code reward: sandbox outcomes become step metrics."""
from __future__ import annotations

import shutil

import pytest
import torch

from batch_helpers import score_and_check

from upslope.batch import build_batch
from upslope.config import RewardSpec
from upslope.data.humaneval import load_humaneval
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns


@pytest.mark.ci
@pytest.mark.slow  # runs programs to their time limits in the sandbox: ~10 s
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_code_reward_statuses_reach_the_step_metrics():
    ex = load_humaneval(limit=1)[0]
    body = ex.meta["canonical_solution"]
    completions = [f"```python\n{ex.meta['code_prefix']}{body}\n```", "```python\ndef broken(:\n```",
                   f"```python\n{ex.meta['code_prefix']}    while True: pass\n```"]
    batch = build_batch([[1, 2]] * 3, [[3]] * 3, [[-0.1]] * 3, [0, 0, 0], [False] * 3, pad_id=0,
                        meta=[{**ex.meta, "answer": None, "completion": c} for c in completions])
    fns = build_reward_fns([RewardSpec(name="code", options={})])
    combiner = REWARD_COMBINERS.bind("weighted_sum")
    batch, metrics = score_and_check(batch, fns, combiner, 0.0)
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0]
    assert metrics["sandbox/ok"] == 1 and metrics["sandbox/syntax_error"] == 1 and metrics["sandbox/timeout"] == 1
    assert torch.equal(batch.reward_components["code"], batch.rewards)
