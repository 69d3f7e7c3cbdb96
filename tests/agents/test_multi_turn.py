"""The multi_turn rollout on real trajectories (tiny model, HF engine, SmolLM2 tokenizer): every
turn continues the same token sequence, environment tokens are masked, limits hold, reward
parts reach the reward stage, hints decay rewards, and valid tool-call turns get the SFT term."""
from __future__ import annotations

import pytest
import torch

from batch_helpers import score_and_check

from upslope.rollout.multi_turn import AgentRun, multi_turn
from upslope.config import AgentConfig, Plugin, RewardSpec
from upslope.data.tasks import arith
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns
from upslope.engine import SamplingParams
from upslope.train import stages
from upslope.train.learner.logprobs import token_logprobs


def segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 list."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def test_turns_alternate_and_env_tokens_are_masked(agent_batch):
    """Each row is prompt, then model turns (loss_mask 1, sampler log-probs) and environment replies
    (loss_mask 0, log-prob 0) in alternation; the counts match the rollout's metrics."""
    batch, _ = agent_batch
    for i in range(batch.size):
        p, n = int(batch.prompt_lens[i]), int(batch.seq_lens[i])
        assert batch.loss_mask[i, :p].sum() == 0 and batch.loss_mask[i, n:].sum() == 0
        mask = batch.loss_mask[i, p:n].int().tolist()
        runs = segments(mask)
        assert [v for v, _, _ in runs][:2] == [1, 0] and len(runs) >= 3, runs  # model, env, model, ...
        assert all(a != b for (a, _, _), (b, _, _) in zip(runs, runs[1:]))
        env = batch.loss_mask[i, p:n] == 0
        assert (batch.sampler_logprobs[i, p:n][env] == 0).all()
        assert (batch.sampler_logprobs[i, p:n][~env] < 0).all()
        m = batch.meta[i]["metrics"]
        assert m["agent/model_tokens"] == sum(mask) and m["agent/env_tokens"] == len(mask) - sum(mask)
        assert m["agent/turns"] == sum(v for v, _, _ in runs)


def test_the_ids_the_model_saw_are_the_ids_trained_on(agent_batch, hf_engine, tokenizer):
    """The engine's log-probs of every model token, sampled turn by turn, equal the policy's log-probs
    of that token in the final row: each turn was generated from exactly the ids before it in the row
    (a re-tokenised history would change the context and the log-probs)."""
    batch, _ = agent_batch
    lp, _ = token_logprobs(hf_engine.model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    m = batch.loss_mask > 0
    assert m.sum() > 20
    torch.testing.assert_close(lp[m], batch.sampler_logprobs[m], atol=2e-3, rtol=0)


def test_rows_render_as_the_chat_template_renders_the_conversation(agent_batch, tokenizer):
    """Decoded, a row is the chat template's rendering of its conversation (system prompt with the
    tools, user prompt, assistant turns, tool replies), up to the closing of the last turn."""
    batch, _ = agent_batch
    for i in range(batch.size):
        row = tokenizer.decode(batch.input_ids[i, :int(batch.seq_lens[i])].tolist(), skip_special_tokens=False)
        render = tokenizer.apply_chat_template(batch.meta[i]["messages"], tokenize=False)
        assert render.startswith(row)
        assert render[len(row):] in ("\n", "<|im_end|>\n", "")
        assert "<tool_call>" in row and '"calculator"' in row  # the tools are offered in the system prompt
        assert row.count("<|im_start|>tool\n") >= 1


def test_limits_on_turns_and_tokens(agent_batch, agent_run, hf_engine):
    """No trajectory has more than agent.max_turns model turns or more than rollout.max_new_tokens
    tokens after its prompt; with a small budget trajectories end truncated, before an env reply
    that would not fit."""
    batch, examples = agent_batch
    assert int(batch.completion_lens.max()) <= 96
    assert max(m["metrics"]["agent/turns"] for m in batch.meta) <= 3
    small = multi_turn(hf_engine, [], examples[:1], SamplingParams(n=2, temperature=1.0, max_new_tokens=20, seed=1),
                       pad_id=2, run=agent_run)
    assert small.truncated.all() and int(small.completion_lens.max()) <= 20
    for m in small.meta:
        assert m["finish_reason"] == "length" and m["reward_parts"] == {"correct": 0.0}


def test_groups_and_env_reward_through_the_reward_stage(agent_batch):
    """n trajectories per prompt share a group id; the env reward hands the environment's reward parts
    to the combiner as env/<part>, so GRPO advantages are computed per group as for single-turn."""
    batch, _ = agent_batch
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    combiner = REWARD_COMBINERS.bind("weighted_sum")
    scored, _ = score_and_check(batch, build_reward_fns([RewardSpec(name="env")]), combiner, 0.0)
    parts = torch.tensor([m["reward_parts"]["correct"] for m in batch.meta])
    assert torch.equal(scored.reward_components["env/correct"], parts)
    assert torch.equal(scored.rewards, parts)
    from upslope.algos.advantages import grpo  # noqa: PLC0415

    adv = stages.advantage(scored, grpo)
    assert (adv.advantages[batch.loss_mask == 0] == 0).all()


def test_rewards_after_a_hint_are_decayed(tokenizer, hf_engine):
    """A correct answer after one hint earns hint_decay x the reward; the text the hint prefills the
    next turn with is in the row as masked environment tokens."""
    run = AgentRun(AgentConfig(env=Plugin(name="hint_test"), max_turns=3, max_turn_tokens=4, hint_decay=0.25),
                   tokenizer)
    batch = multi_turn(hf_engine, [], arith(count=1), SamplingParams(n=2, max_new_tokens=64, seed=0), 2, run=run)
    assert [m["reward_parts"] for m in batch.meta] == [{"correct": 0.25}] * 2
    assert [m["metrics"]["agent/hints"] for m in batch.meta] == [1.0, 1.0]
    assert "Try again.<|im_end|>\n<|im_start|>assistant\nAnswer:" in batch.meta[0]["transcript"]
    for i in range(batch.size):  # the prefilled "Answer:" is environment text: in the row, masked
        row = tokenizer.decode(batch.input_ids[i, :int(batch.seq_lens[i])].tolist(), skip_special_tokens=False)
        assert tokenizer.apply_chat_template(batch.meta[i]["messages"], tokenize=False).startswith(row)
        p = int(batch.prompt_lens[i])
        runs = segments(batch.loss_mask[i, p:int(batch.seq_lens[i])].int().tolist())
        _, start, end = runs[1]
        assert tokenizer.decode(batch.input_ids[i, p + start:p + end]).endswith("assistant\nAnswer:")


@pytest.mark.parametrize("sft_coef", [0.0, 0.5])
def test_valid_tool_call_turns_of_successful_trajectories_get_the_sft_term(tokenizer, hf_engine, sft_coef):
    """With agent.sft_coef, the model turn whose tool calls all ran (in a successful trajectory) gets
    +sft_coef on its advantage; other turns and env tokens get nothing; 0 turns it off."""
    run = AgentRun(AgentConfig(env=Plugin(name="tool_test"), tools=[Plugin(name="calculator")], max_turns=3,
                               max_turn_tokens=4, sft_coef=sft_coef), tokenizer)
    batch = multi_turn(hf_engine, [], arith(count=1), SamplingParams(n=2, max_new_tokens=64, seed=0), 2, run=run)
    assert "408" in batch.meta[0]["transcript"]  # the calculator's result came back
    assert batch.meta[0]["metrics"]["agent/valid_tool_call_rate"] == 1.0
    batch.rewards = torch.ones(batch.size)
    out = stages.advantage(batch, lambda b: torch.zeros_like(b.loss_mask))
    for i in range(batch.size):
        p = int(batch.prompt_lens[i])
        first_turn = slice(p, p + 4)
        assert torch.equal(out.advantages[i, first_turn], torch.full((4,), sft_coef))
        assert (out.advantages[i, p + 4:] == 0).all()


@pytest.mark.slow  # 2 x 2 multi-turn conversations of up to 96 tokens a turn on vLLM's CPU build: about 20 s
def test_multi_turn_through_vllm(agent_run, vllm_engine, hf_engine, tokenizer):
    """The same rollout through the session's vLLM engine (prefix caching on): rows render as the chat
    template renders the conversation, env tokens are masked, and vLLM's bf16 log-probs of the model
    tokens agree with the fp32 policy's on the final rows."""
    batch = multi_turn(vllm_engine, [], arith(split="test", count=2, digits=3),
                       SamplingParams(n=2, temperature=1.0, max_new_tokens=96, stop_token_ids=[2]), 2, run=agent_run)
    for i in range(batch.size):
        row = tokenizer.decode(batch.input_ids[i, :int(batch.seq_lens[i])].tolist(), skip_special_tokens=False)
        assert tokenizer.apply_chat_template(batch.meta[i]["messages"], tokenize=False).startswith(row)
        assert batch.meta[i]["metrics"]["agent/env_tokens"] > 0
    m = batch.loss_mask > 0
    assert (batch.sampler_logprobs[~m] == 0).all()
    lp, _ = token_logprobs(hf_engine.model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    assert (lp[m] - batch.sampler_logprobs[m]).abs().mean() < 0.1


TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
                  "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tools_go_through_the_template_when_it_takes_them(tokenizer):
    """A chat template that renders `tools=` gets the schemas there; SmolLM2's, which ignores them,
    gets the format's instructions in the system message instead."""
    import copy

    own = copy.deepcopy(tokenizer)
    own.chat_template = TOOLS_TEMPLATE
    cfg = AgentConfig(tools=[Plugin(name="calculator")])
    [example] = arith(count=1)
    with_tools = AgentRun(cfg, own).start(example, 0)
    text = own.decode(with_tools.prompt)
    assert text.startswith('<|im_start|>system\nTools: [{"type": "function", "function": {"name": "calculator"')
    assert "<tool_call>" not in text and with_tools.history == example.messages()
    plain = AgentRun(cfg, tokenizer).start(example, 0)
    assert plain.history[0]["role"] == "system" and "<tool_call>" in plain.history[0]["content"]
    assert '"name": "calculator"' in tokenizer.decode(plain.prompt)


def test_without_guidance_a_hinted_answer_ends_the_trajectory(tokenizer, hf_engine):
    """guidance=False (evaluation): the turn the environment would answer with a hint ends the trajectory
    with what it earned unaided (here nothing), no hint text, no second turn."""
    cfg = AgentConfig(env=Plugin(name="hint_test"), max_turns=3, max_turn_tokens=4, hint_decay=0.25)
    params = SamplingParams(n=2, max_new_tokens=64, seed=0)
    guided = multi_turn(hf_engine, [], arith(count=1), params, 2, run=AgentRun(cfg, tokenizer))
    plain = multi_turn(hf_engine, [], arith(count=1), params, 2, run=AgentRun(cfg, tokenizer, guidance=False))
    assert [m["reward_parts"] for m in plain.meta] == [{"correct": 0.0}] * 2
    assert [m["metrics"]["agent/turns"] for m in plain.meta] == [1.0, 1.0]
    assert [m["metrics"]["agent/hints"] for m in plain.meta] == [0.0, 0.0]
    assert all("Try again." not in m["transcript"] for m in plain.meta)
    assert bool((plain.loss_mask[:, int(plain.prompt_lens[0]):].sum(1) == plain.completion_lens).all())
    first_turn = [m["transcript"].split("<|im_end|>")[0] for m in guided.meta]  # the same first answer
    assert [m["transcript"].split("<|im_end|>")[0] for m in plain.meta] == first_turn


def test_a_reply_that_does_not_fit_is_counted_not_given(tokenizer, hf_engine):
    """With no room for the hint ("Try again." and the template's turn markers) in rollout.max_new_tokens, the
    trajectory ends truncated after its first turn: agent/env_reply_cut 1, and agent/hints 0 (no guidance
    reached the policy; it was counted as given before)."""
    cfg = AgentConfig(env=Plugin(name="hint_test"), max_turns=3, max_turn_tokens=4, hint_decay=0.25)
    batch = multi_turn(hf_engine, [], arith(count=1), SamplingParams(n=2, max_new_tokens=8, seed=0), 2,
                       run=AgentRun(cfg, tokenizer))
    for m in batch.meta:
        assert m["metrics"]["agent/env_reply_cut"] == 1.0 and m["metrics"]["agent/hints"] == 0.0
        assert m["metrics"]["agent/turns"] == 1.0 and m["metrics"]["agent/env_tokens"] == 0.0
        assert m["finish_reason"] == "length" and "Try again." not in m["transcript"]
    roomy = multi_turn(hf_engine, [], arith(count=1), SamplingParams(n=2, max_new_tokens=64, seed=0), 2,
                       run=AgentRun(cfg, tokenizer))
    assert [m["metrics"]["agent/env_reply_cut"] for m in roomy.meta] == [0.0, 0.0]
