"""The multi_turn_unlocked rollout on real trajectories (tiny model, HF engine, SmolLM2 tokenizer): the rows
are multi_turn's (alternating model and masked environment turns, the sampler's log-probs equal to the
learner's), and a slow environment holds back only its own trajectory."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from agent_helpers import ECHO, echo_config
from upslope.agents import Environment, StepResult
from upslope.rollout.multi_turn import AgentRun
from upslope.config import AgentConfig, Plugin
from upslope.data.tasks import arith
from upslope.registry import ENVIRONMENTS
from upslope.engine import SamplingParams
from upslope.rollout.unlocked import run_unlocked, multi_turn_unlocked_batch
from upslope.train.learner.logprobs import token_logprobs

PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=96, seed=3, stop_token_ids=[2])
EVENTS: list[tuple[str, str, float]] = []  # (example id, event, time) of the slow-environment test
LOCK = threading.Lock()


@ENVIRONMENTS.register("slow_first_test")
class SlowFirst(Environment):
    """Answers every turn after `delay` seconds for the example arith-test-0, at once for the others; done
    after 3 turns; every step is logged in EVENTS."""

    def __init__(self, *, delay: float = 3.0):
        self.delay, self.seen = delay, 0

    def step(self, history, model_turn):
        self.seen += 1
        slow = self.example.id == "arith-test-0"
        if slow:
            time.sleep(self.delay)
        with LOCK:
            EVENTS.append((self.example.id, f"step{self.seen}", time.monotonic()))
        done = self.seen >= 3
        return StepResult([{"role": "user", "content": "go on"}], done=done,
                          reward_parts={"correct": 1.0} if done else {})


def test_unlocked_rows_are_multi_turn_rows(tokenizer, hf_engine):
    assert ECHO
    run = AgentRun(echo_config(), tokenizer)
    batch = multi_turn_unlocked_batch(hf_engine, [], arith(split="test", count=2, digits=3), PARAMS, 2, run=run,
                                      concurrency=4)
    assert batch.size == 6 and batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    for i in range(batch.size):
        p, n = int(batch.prompt_lens[i]), int(batch.seq_lens[i])
        mask = batch.loss_mask[i, p:n].int().tolist()
        assert mask[0] == 1 and 0 in mask
        assert batch.meta[i]["metrics"]["agent/turns"] == 3 and "correct" in batch.meta[i]["reward_parts"]
    lp, _ = token_logprobs(hf_engine.model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    m = batch.loss_mask > 0
    torch.testing.assert_close(lp[m], batch.sampler_logprobs[m], atol=2e-3, rtol=0)


@pytest.mark.ci
@pytest.mark.slow  # waits on an environment that takes 3 s a turn: ~10 s
def test_a_slow_environment_holds_back_only_its_own_trajectory(tokenizer, hf_engine):
    """One example's environment takes 3 s a turn: the other trajectories finish all their turns before its
    first answer comes (in lockstep they would wait for it at every turn)."""
    EVENTS.clear()
    cfg = AgentConfig(env=Plugin(name="slow_first_test"), max_turns=3, max_turn_tokens=6)
    run = AgentRun(cfg, tokenizer)
    trajs = run_unlocked(run, hf_engine, arith(split="test", count=3), SamplingParams(n=2, max_new_tokens=60, seed=1,
                                                                                      stop_token_ids=[2]))
    assert all(t.turns == 3 for t in trajs)
    slow_first = min(t for ex, ev, t in EVENTS if ex == "arith-test-0")
    fast_last = max(t for ex, ev, t in EVENTS if ex != "arith-test-0")
    assert fast_last < slow_first, "the fast trajectories waited for the slow environment"
    assert [ev for ex, ev, _ in EVENTS if ex != "arith-test-0"].count("step3") == 4
