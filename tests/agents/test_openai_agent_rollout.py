"""The openai_agent rollout: an agent program (a Python function in a user file, or a shell command) runs
once per trajectory against its own base URL; its calls become the rows of a Batch in the prompt's group,
its returned reward reaches the env reward, and failures are one line. Tiny model, HF engine, the real
openai client inside the programs."""
from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")  # the agent programs below use the OpenAI client

from upslope.config import load_config
from upslope.data.tasks import arith
from upslope.errors import ConfigError, UpslopeError
from upslope.rewards import build_reward_fns
from upslope.registry import REWARD_COMBINERS
from upslope.engine import SamplingParams
from upslope.train import stages
from upslope.rollout.plugin import make_rollout

PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=48, seed=2, stop_token_ids=[2])

AGENT = '''
from openai import OpenAI


def agent(base_url, row):
    """Two calls; the second after a feedback message; the reward is the parity of the last reply's length."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    for turn in range(2):
        text = client.chat.completions.create(model="m", messages=messages, max_tokens=8).choices[0].message.content
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Check it."}]
    return {"correct": float(len(text) % 2 == 0), "calls": 2.0}


def rewriting(base_url, row):
    """Each call sends a fresh context (the question again), as agents that summarise their history do."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    for turn in range(2):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{row['prompt']} ({turn})"}],
                                       max_tokens=4)
    return None


def broken(base_url, row):
    raise RuntimeError("the agent's own bug")
'''

COMMAND = '''
import json, os, sys
from openai import OpenAI

row = json.load(sys.stdin)
client = OpenAI(max_retries=0)  # base URL and key from the environment
reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=6)
print("some log line")
print(json.dumps(1.0 if row["answer"] == row["a"] * row["b"] else 0.0))
'''


def rollout_for(tmp_path: Path, tiny_model_path: str, tokenizer, **options):
    (tmp_path / "agents.py").write_text(textwrap.dedent(AGENT))
    opts = ", ".join(f"{k}: {v}" for k, v in options.items())
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", f"model.name={tiny_model_path}", "rollout.kind=openai_agent",
                             f"rollout.options={{{opts}}}", "agent.max_turns=3", "reward=[{name: env}]"])
    return make_rollout(cfg, tokenizer), cfg


def test_a_function_program_trains_in_groups_with_its_reward(tmp_path, tiny_model_path, tokenizer, hf_engine):
    rollout, cfg = rollout_for(tmp_path, tiny_model_path, tokenizer, agent=f"{tmp_path}/agents.py:agent")
    examples = arith(split="test", count=2)
    batch = rollout(hf_engine, [], examples, PARAMS, 2, group_offset=5)
    assert batch.size == 6 and batch.group_ids.tolist() == [5, 5, 5, 6, 6, 6]
    for i, meta in enumerate(batch.meta):
        assert meta["metrics"]["agent/turns"] == 2 and meta["metrics"]["agent/rows"] == 1
        assert set(meta["reward_parts"]) == {"correct", "calls"}
        assert meta["reward_parts"]["correct"] == float(len(meta["completion"]) % 2 == 0)
        p, n = int(batch.prompt_lens[i]), int(batch.seq_lens[i])
        mask = batch.loss_mask[i, p:n].int().tolist()
        assert mask[0] == 1 and 0 in mask and mask[-1] == 1  # reply, feedback (masked), reply
        assert meta["prompt"] == examples[i // 3].prompt
    fns = build_reward_fns(cfg.reward)
    scored, _, _ = stages.score_batch(batch, fns, REWARD_COMBINERS.bind("weighted_sum", {}), 0.0)
    want = torch.tensor([m["reward_parts"]["correct"] + m["reward_parts"]["calls"] for m in batch.meta])
    torch.testing.assert_close(scored.rewards, want)


def test_a_program_that_rewrites_its_context_gives_several_rows(tmp_path, tiny_model_path, tokenizer, hf_engine):
    rollout, _ = rollout_for(tmp_path, tiny_model_path, tokenizer, agent=f"{tmp_path}/agents.py:rewriting")
    batch = rollout(hf_engine, [], arith(split="test", count=1), PARAMS, 2)
    assert batch.size == 6 and set(batch.group_ids.tolist()) == {0}  # 3 trajectories x 2 rows, one group
    assert all(m["metrics"]["agent/context_rewrites"] == 1 and "reward_parts" not in m for m in batch.meta)


def test_a_command_program_gets_the_row_on_stdin_and_prints_its_reward(tmp_path, tiny_model_path, tokenizer, hf_engine):
    (tmp_path / "agent_cmd.py").write_text(textwrap.dedent(COMMAND))
    command = shlex.join([sys.executable, str(tmp_path / "agent_cmd.py")])  # a shell command: paths quoted
    rollout, _ = rollout_for(tmp_path, tiny_model_path, tokenizer, command=json.dumps(command))
    batch = rollout(hf_engine, [], arith(split="test", count=2), PARAMS, 2)
    assert batch.size == 6 and all(m["reward_parts"] == {"correct": 1.0} for m in batch.meta)


def test_program_failures_and_missing_programs_are_one_line(tmp_path, tiny_model_path, tokenizer, hf_engine):
    rollout, _ = rollout_for(tmp_path, tiny_model_path, tokenizer, agent=f"{tmp_path}/agents.py:broken")
    with pytest.raises(UpslopeError, match=r"the agent failed on example arith-test-0: RuntimeError: the agent's own bug"):
        rollout(hf_engine, [], arith(split="test", count=1), PARAMS, 2)
    with pytest.raises(ConfigError, match="rollout.options.agent .* or rollout.options.command"):
        rollout_for(tmp_path, tiny_model_path, tokenizer)
    with pytest.raises(ConfigError, match="has no function 'nothing'"):
        rollout_for(tmp_path, tiny_model_path, tokenizer, agent=f"{tmp_path}/agents.py:nothing")
