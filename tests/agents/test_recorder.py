"""The recorder of agent calls on the real SmolLM2 tokenizer and chat template: a conversation continues
from the recorded ids (a reply the tokenizer would split differently stays as sampled), only the new
messages are tokenised, a template that rewrites history is detected, and the limits hold. Replies are
given as the engine's Completion objects built from known token ids, so each case is exact."""
from __future__ import annotations

import copy

import pytest

from upslope.agents.chat_render import ChatRenderer
from upslope.agents.recorder import LimitReached, Recorder
from upslope.engine import Completion

EOS = 2
# the SmolLM2 template, except that an assistant turn followed by other messages loses its <think> block,
# as reasoning models' templates do
THINK_STRIPPING = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def reply(tokenizer, pieces: list[str], stop: bool = True) -> Completion:
    """A completion whose tokens are each piece tokenised on its own (pieces that the tokenizer would merge
    give a sequence it would never produce from the text), ended by the end-of-turn token."""
    ids = [t for p in pieces for t in tokenizer(p, add_special_tokens=False)["input_ids"]] + ([EOS] if stop else [])
    return Completion(ids, [-0.5] * len(ids), "".join(pieces), "stop" if stop else "length")


def answer(renderer: ChatRenderer, comp: Completion) -> dict:
    """The assistant message the server returns for `comp`."""
    toks = comp.token_ids[:-1] if comp.token_ids[-1] == EOS else comp.token_ids
    return {"role": "assistant", "content": renderer.reply_text(toks)}


def recorder(tokenizer, **kw) -> Recorder:
    limits = dict(max_calls=4, max_tokens=300)
    limits.update(kw.pop("limits", {}))
    return Recorder(ChatRenderer(tokenizer), **limits, **kw)


def test_a_conversation_continues_from_the_sampled_ids(tokenizer):
    rec = recorder(tokenizer)
    r = rec.renderer
    convo = [{"role": "user", "content": "Say hello."}]
    first = rec.prepare(convo)
    assert first.row is None and first.prompt == r.encode(r.text(convo))
    comp = reply(tokenizer, [" hel", "lo wor", "ld"])  # the tokenizer writes " hello world" in other ids
    assert comp.token_ids[:-1] != r.encode(" hello world")
    msg = answer(r, comp)
    assert msg["content"] == " hello world"
    row = rec.record(first, comp, [EOS], msg)
    convo += [msg, {"role": "user", "content": "Again."}]
    second = rec.prepare(convo)
    assert second.row is row
    # the prompt is the recorded ids, then only the new message tokenised: the same text as the template's ...
    assert second.prompt == first.prompt + comp.token_ids + second.added
    assert r.decode(second.prompt) == r.text(convo)
    # ... in other ids than a fresh tokenisation of it, which differs exactly where the model wrote
    fresh = r.encode(r.text(convo))
    assert fresh != second.prompt
    assert fresh[:len(first.prompt)] == first.prompt
    assert second.added == r.encode("\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n")
    assert fresh[-len(second.added):] == second.added
    rec.record(second, reply(tokenizer, [" ok"]), [EOS], answer(r, reply(tokenizer, [" ok"])))
    assert len(rec.rows) == 1 and rec.counts.template_rewrites == 0
    assert row.mask == [1] * len(comp.token_ids) + [0] * len(second.added) + [1, 1]
    assert row.logprobs[len(comp.token_ids)] == 0.0 and row.logprobs[0] == -0.5


def test_a_template_that_rewrites_history_is_detected(tokenizer):
    """With a template that drops earlier <think> blocks the second call's rendering differs from what the
    model saw: detected; `keep` continues the row token-exact, `follow` starts a row from the template's text.
    The same conversation under the append-only SmolLM2 template is not flagged."""
    stripping = copy.deepcopy(tokenizer)
    stripping.chat_template = THINK_STRIPPING
    outcomes = {}
    for name, tok, policy in [("plain", tokenizer, "keep"), ("keep", stripping, "keep"), ("follow", stripping, "follow")]:
        rec = recorder(tok, on_rewrite=policy)
        convo = [{"role": "user", "content": "What is 2+2?"}]
        call = rec.prepare(convo)
        comp = reply(tok, ["<think>", "two and two", "</think>", " 4"])
        msg = answer(rec.renderer, comp)
        rec.record(call, comp, [EOS], msg)
        convo += [msg, {"role": "user", "content": "Sure?"}]
        second = rec.prepare(convo)
        rec.record(second, reply(tok, [" yes"]), [EOS], answer(rec.renderer, reply(tok, [" yes"])))
        outcomes[name] = (rec.counts.template_rewrites, len(rec.rows), second.row is not None)
        if name == "keep":
            assert "two and two" in rec.rewrite_example or "think" in rec.rewrite_example
            assert "<think>two and two</think>" in rec.renderer.decode(second.prompt)
        if name == "follow":
            assert "two and two" not in rec.renderer.decode(rec.rows[1].prompt)
    assert outcomes == {"plain": (0, 1, True), "keep": (1, 1, True), "follow": (1, 2, False)}


def test_a_rewritten_context_starts_a_new_row_and_concurrent_calls_branch(tokenizer):
    rec = recorder(tokenizer)
    r = rec.renderer
    convo = [{"role": "user", "content": "Plan."}]
    rec.record(rec.prepare(convo), reply(tokenizer, [" step one"]), [EOS], {"role": "assistant", "content": " step one"})
    # the agent summarises its context instead of sending the reply back: nothing to continue
    summary = [{"role": "user", "content": "Plan. (You said: step one.) Next?"}]
    rec.record(rec.prepare(summary), reply(tokenizer, [" two"]), [EOS], {"role": "assistant", "content": " two"})
    assert len(rec.rows) == 2 and rec.counts.context_rewrites == 1
    # two calls prepared on the same row: the first to answer grows it, the second becomes its own row
    base = summary + [{"role": "assistant", "content": " two"}]
    a = rec.prepare(base + [{"role": "user", "content": "A?"}])
    b = rec.prepare(base + [{"role": "user", "content": "B?"}])
    assert a.row is b.row is rec.rows[1]
    rec.record(a, reply(tokenizer, [" a"]), [EOS], {"role": "assistant", "content": " a"})
    rec.record(b, reply(tokenizer, [" b"]), [EOS], {"role": "assistant", "content": " b"})
    assert len(rec.rows) == 3 and rec.counts.branches == 1
    assert rec.rows[2].prompt == b.prompt and sum(rec.rows[2].mask) == len(rec.rows[2].ids)
    assert r.decode(rec.rows[1].prompt + rec.rows[1].ids).endswith("A?<|im_end|>\n<|im_start|>assistant\n a<|im_end|>")


def test_limits_end_the_trajectory_with_a_coded_error(tokenizer):
    rec = recorder(tokenizer, limits=dict(max_calls=2, max_tokens=24), max_turn_tokens=16)
    convo = [{"role": "user", "content": "Talk."}]
    call = rec.prepare(convo, max_tokens=100)
    assert call.max_tokens == 16  # the per-turn limit under the request's and the budget
    comp = reply(tokenizer, [" word"] * 16, stop=False)
    rec.record(call, comp, [EOS], answer(rec.renderer, comp))
    convo += [answer(rec.renderer, comp), {"role": "user", "content": "More."}]
    with pytest.raises(LimitReached) as err:  # 16 tokens + the closing and the new message: over 24
        rec.prepare(convo)
    assert err.value.code == "context_length_exceeded" and rec.rows[0].truncated
    with pytest.raises(LimitReached) as err:
        rec.prepare(convo)
    assert err.value.code == "turn_limit"
    assert rec.counts.limit_errors == 2


def test_a_prefilled_turn_is_environment_text_and_the_reply_continues_it(tokenizer):
    """continue_final_message: the assistant turn's start is the agent's (masked); the row's conversation
    holds prefill + reply, which a later call sends back to continue it."""
    rec = recorder(tokenizer)
    r = rec.renderer
    convo = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]
    call = rec.prepare(convo, prefill=True)
    assert r.decode(call.prompt).endswith("<|im_start|>assistant\nThe answer is")
    comp = reply(tokenizer, [" 4"])
    rec.record(call, comp, [EOS], answer(r, comp))
    convo[-1] = {"role": "assistant", "content": "The answer is 4"}
    nxt = rec.prepare(convo + [{"role": "user", "content": "Why?"}])
    assert nxt.row is rec.rows[0] and rec.counts.template_rewrites == 0
