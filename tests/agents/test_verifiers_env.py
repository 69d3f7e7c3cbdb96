"""verifiers environments (the classic API: load_environment, SingleTurnEnv, MultiTurnEnv with env_response,
Rubric) as data.task=verifiers, rolled out by their own code through rollout.kind=openai_agent against the
policy's endpoint (tiny model, HF engine): rows are token-exact, the environment's turns are masked, the
rubric's scores are the reward parts."""
from __future__ import annotations

import textwrap

import pytest
import torch

pytest.importorskip("verifiers")

from upslope.config import load_config  # noqa: E402
from upslope.data import load_examples  # noqa: E402
from upslope.engine import SamplingParams  # noqa: E402
from upslope.errors import ConfigError  # noqa: E402
from upslope.rollout.plugin import make_rollout  # noqa: E402
from upslope.train.learner.logprobs import token_logprobs  # noqa: E402

# an environment written as the verifiers documentation shows: a dataset, a rubric of reward functions,
# env_response for the environment's turn, a stop condition
ENV = '''
from datasets import Dataset
import verifiers as vf


class Retry(vf.MultiTurnEnv):
    """Asks again after every reply until the reply contains the answer or the turns run out."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Not yet. Once more, only the number."}]

    @vf.stop
    async def answered(self, state, **kwargs):
        steps = state["trajectory"]
        return bool(steps) and state["answer"] in (steps[-1]["completion"][-1]["content"] or "")


def even_length(completion, **kwargs):
    return float(len(completion[-1]["content"] or "") % 2 == 0)


def correct(completion, answer, **kwargs):
    return float(answer in (completion[-1]["content"] or ""))


def load_environment(n=6, multi_turn=True):
    rows = [{"question": f"What is {a} * 7?", "answer": str(7 * a)} for a in range(2, 2 + n)]
    rubric = vf.Rubric(funcs=[correct, even_length], weights=[1.0, 0.5])
    if not multi_turn:
        return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
    return Retry(dataset=Dataset.from_list(rows[:4]), eval_dataset=Dataset.from_list(rows[4:]), rubric=rubric,
                 max_turns=3)
'''


def config(tmp_path, tiny_model_path, **args):
    (tmp_path / "retry_env.py").write_text(textwrap.dedent(ENV))
    opts = ", ".join(f"{k}: {str(v).lower()}" for k, v in args.items())
    return load_config(None, [f"run_dir={tmp_path / 'run'}", f"model.name={tiny_model_path}", "data.task=verifiers",
                              f"data.options={{env: {tmp_path}/retry_env.py, args: {{{opts}}}}}",
                              "rollout.kind=openai_agent",
                              "rollout.options={agent: 'upslope.agents.verifiers_env:program'}",
                              "agent.max_turns=3", "agent.max_turn_tokens=6", "reward=[{name: env}]"])


def test_a_multi_turn_environment_trains_through_its_own_rollout(tmp_path, tiny_model_path, tokenizer, hf_engine):
    cfg = config(tmp_path, tiny_model_path)
    train, test = load_examples(cfg.data, "train"), load_examples(cfg.data.model_copy(update={"split": "test"}), "test")
    assert [e.answer for e in train] == ["14", "21", "28", "35"] and [e.answer for e in test] == ["42", "49"]
    assert train[0].prompt[-1] == {"role": "user", "content": "What is 2 * 7?"}
    batch = make_rollout(cfg, tokenizer)(hf_engine, [], train[:2], SamplingParams(n=2, max_new_tokens=96, seed=4,
                                                                                 stop_token_ids=[2]), 2)
    assert batch.size == 4 and batch.group_ids.tolist() == [0, 0, 1, 1]
    for i, m in enumerate(batch.meta):
        assert m["metrics"]["agent/turns"] == 3 and m["metrics"]["agent/rows"] == 1  # the env asked twice more
        # the rubric's weighted sum of our last reply, and only it (its metrics, num_turns among them, are no reward)
        reply = m["completion"]
        assert m["reward_parts"] == {"reward": float(m["answer"] in reply) + 0.5 * float(len(reply) % 2 == 0)}
        assert sum(msg["content"] == "Not yet. Once more, only the number." for msg in m["messages"]) == 2
    lp, _ = token_logprobs(hf_engine.model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    mask = batch.loss_mask > 0
    torch.testing.assert_close(lp[mask], batch.sampler_logprobs[mask], atol=2e-3, rtol=0)


def test_a_single_turn_environment_and_a_missing_one(tmp_path, tiny_model_path, tokenizer, hf_engine):
    cfg = config(tmp_path, tiny_model_path, multi_turn=False)
    examples = load_examples(cfg.data, "train")[:1]
    batch = make_rollout(cfg, tokenizer)(hf_engine, [], examples, SamplingParams(n=2, max_new_tokens=16, seed=1,
                                                                                stop_token_ids=[2]), 2)
    assert batch.size == 2 and all(m["metrics"]["agent/turns"] == 1 for m in batch.meta)
    bad = cfg.data.model_copy(update={"options": {"env": str(tmp_path / "nothing.py")}})
    with pytest.raises(ConfigError, match="nothing.py not found"):
        load_examples(bad, "train")
