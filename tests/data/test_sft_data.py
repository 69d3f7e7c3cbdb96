"""SFT building blocks: the assistant-only mask on the real SmolLM2 chat template, SFT data
rows and their one-line errors, the NLL/DFT losses, and RFT's rejection step."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.aggregate import loss_normalizers
from upslope.algos.rejection import keep_indices
from upslope.algos.sft import sft_loss, sft_token_loss
from upslope.config import DataConfig
from upslope.data.chat import assistant_mask
from upslope.data.prompts import encode_prompts
from upslope.data.sft import encode_conversations, load_conversations, sft_batch
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.models import load_tokenizer

CHAT = Path(__file__).resolve().parents[1] / "fixtures" / "chat.jsonl"
FAST = settings(max_examples=50, deadline=None)
IM_END = 2  # SmolLM2's <|im_end|>: end of turn, eos and pad

CONVERSATIONS = [
    [{"role": "user", "content": "What is 6 * 9?"}, {"role": "assistant", "content": "54"},
     {"role": "user", "content": "And 6 * 8?"}, {"role": "assistant", "content": "48"}],
    [{"role": "system", "content": "You are a careful calculator."}, {"role": "user", "content": "Compute 2 * 5."},
     {"role": "assistant", "content": "2 * 5 = 10\n\nSo: 10."}, {"role": "user", "content": "Now double it."},
     {"role": "assistant", "content": " 20"}, {"role": "user", "content": "Thanks!"}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi! 👋 <b>Hello</b>"}],
    [{"role": "user", "content": "Spaces?"}, {"role": "assistant", "content": "  two leading spaces "},
     {"role": "user", "content": "Newlines?"}, {"role": "assistant", "content": "\n\n56\n"}],
]


def segments(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of masked tokens."""
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


# ---------------------------------------------------------------- the mask on the real template


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["two_turns", "system_three_users", "unicode", "whitespace"])
def test_mask_covers_exactly_each_assistant_reply_and_its_end_token(messages, tokenizer):
    ids, mask = assistant_mask(messages, tokenizer, [IM_END])
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)  # the exact render
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    segs = segments(ids, mask)
    assert [tokenizer.decode(s) for s in segs] == [r + "<|im_end|>" for r in replies]
    assert all(s[-1] == IM_END for s in segs)
    # nothing else is trained: not the system/user turns, the role headers or the newline after <|im_end|>
    untrained = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    for m in messages:
        if m["role"] != "assistant":
            assert m["content"] in untrained
    assert untrained.count("<|im_start|>assistant\n") == len(replies)
    starts = [i for i in range(len(ids)) if mask[i] and (i == 0 or not mask[i - 1])]
    for k, (s, seg, j) in enumerate(zip(starts, segs, [j for j, m in enumerate(messages) if m["role"] == "assistant"])):
        header = tokenizer.apply_chat_template(messages[:j], tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(ids[:s]) == header
        if k == 0:  # the first reply's context is tokenised exactly as a prompt is for generation
            assert ids[:s] == tokenizer(header, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids[s + len(seg)]) == "\n"  # the separator after <|im_end|> is not trained


PIECES = list("ab xyZ09*=?.\n\t,é中") + ["  ", "\n\n", "The ", " 42"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3), st.booleans())
def test_mask_property_on_random_conversations(tokenizer, system, turns, trailing_user):
    """Any conversation: the trained runs decode to the replies plus <|im_end|>, and the ids
    decode to the exact render."""
    messages = [{"role": "system", "content": "sys"}] if system else []
    for question, reply in turns:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    if trailing_user:
        messages.append({"role": "user", "content": "more"})
    ids, mask = assistant_mask(messages, tokenizer, [IM_END])
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)
    assert [tokenizer.decode(s) for s in segments(ids, mask)] == [r + "<|im_end|>" for _, r in turns]


def test_single_turn_prompt_tokens_equal_the_rl_prompt_encoding(tokenizer):
    """The context before the reply is exactly what RL prompts encode to (incl. the default
    system prompt the SmolLM2 template inserts)."""
    ex = Example(prompt="What is 7 * 8?")
    (prompt_ids,), _ = encode_prompts([ex], tokenizer, system_prompt="Be brief.")
    ids, mask = assistant_mask(ex.messages("Be brief.") + [{"role": "assistant", "content": "56"}], tokenizer, [IM_END])
    first = mask.index(1)
    assert ids[:first] == prompt_ids and sum(mask[:first]) == 0
    (bare_ids,), _ = encode_prompts([ex], tokenizer)
    assert "You are a helpful AI assistant named SmolLM" in tokenizer.decode(bare_ids)
    ids, mask = assistant_mask(ex.messages() + [{"role": "assistant", "content": "56"}], tokenizer, [IM_END])
    assert ids[:mask.index(1)] == bare_ids


def test_template_that_rewrites_earlier_turns_is_a_clear_error(smollm_path, tokenizer):
    """A template that hides past assistant replies (as reasoning templates drop old thoughts)
    is not prefix-stable: no mask can be read off it."""
    hiding = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and not loop.last %}"
              "[hidden]{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = load_tokenizer(smollm_path, chat_template=hiding)
    with pytest.raises(DataError, match=r"row 3: the chat template is not prefix-stable"):
        assistant_mask(CONVERSATIONS[0], tok, [IM_END], where="row 3")
    assistant_mask(CONVERSATIONS[2], tok, [IM_END])  # one assistant turn: fine
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(DataError, match="ignores add_generation_prompt"):
        assistant_mask(CONVERSATIONS[2], tok, [IM_END])


def test_template_without_stop_token_trains_the_whole_turn(smollm_path):
    """With no end-of-turn stop token in the template, everything the turn appends is trained."""
    tok = load_tokenizer(smollm_path, chat_template=(
        "{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n{% else %}A: {{ m['content'] }}\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"))
    ids, mask = assistant_mask(CONVERSATIONS[0], tok, [IM_END])
    assert [tok.decode(s) for s in segments(ids, mask)] == [" 54\n", " 48\n"]


@pytest.mark.parametrize("messages, expected", [
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    ([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}], "starts with an assistant"),
])
def test_conversations_without_a_reply_to_train_are_errors(messages, expected, tokenizer):
    with pytest.raises(DataError, match=expected):
        assistant_mask(messages, tokenizer, [IM_END])


# ---------------------------------------------------------------- SFT data rows


def test_chat_rows_and_prompt_response_rows(tokenizer, tmp_path):
    convs = load_conversations(DataConfig(path=str(CHAT), messages_field="messages", system_prompt="Be brief."),
                               "response")
    assert len(convs) == 6 and convs[0].where == f"{CHAT}:1"
    assert convs[0].messages[0] == {"role": "system", "content": "Be brief."}  # added where none is given
    assert convs[1].messages[0]["content"] == "Answer with a number only."  # the row's own system turn is kept
    pr = tmp_path / "pr.jsonl"
    pr.write_text(json.dumps({"question": "2 * 3", "reply": "6", "id": 9}) + "\n")
    (conv,) = load_conversations(DataConfig(path=str(pr), prompt_field="question", template="Compute {prompt}.",
                                            system_prompt="Be brief."), "reply")
    assert conv.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 2 * 3."},
                             {"role": "assistant", "content": "6"}]
    assert conv.meta == {"id": 9}
    (enc,) = encode_conversations([conv], tokenizer, [IM_END], max_tokens=512)
    batch = sft_batch([enc, enc], tokenizer.pad_token_id)
    assert batch.group_ids.tolist() == [0, 1] and batch.num_loss_tokens() == 2 * 2  # "6" and <|im_end|>
    assert int(batch.prompt_lens[0]) == enc.mask.index(1)
    assert batch.loss_mask[0, : batch.prompt_lens[0]].sum() == 0


@pytest.mark.parametrize("line, fields, expected", [
    ('{"messages": "hi"}', {"messages_field": "messages"}, ":2: field 'messages' must be a non-empty list"),
    ('{"messages": [{"role": "user", "content": ["a"]}]}', {"messages_field": "messages"},
     ":2: field 'messages' message 1 must be an object with text 'role' and 'content'"),
    ('{"chat": []}', {"messages_field": "messages"}, ":2: field 'messages' missing (data.messages_field"),
    ('{"prompt": "x"}', {}, ":2: field 'response' missing (sft.response_field"),
    ('{"text": "x", "response": "y"}', {}, ":2: field 'prompt' missing (data.prompt_field"),
    ('{"prompt": 3, "response": "y"}', {}, ":2: field 'prompt' must be text, got int"),
    ('{"prompt": "x", "response": "y"', {}, ":2: invalid JSON"),
])
def test_bad_rows_name_file_line_and_field(line, fields, expected, tmp_path):
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "prompt": "a", "response": "b"}
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(DataError) as err:
        load_conversations(DataConfig(path=str(f), **fields), "response")
    assert str(err.value).startswith(str(f)) and expected in str(err.value), str(err.value)


def test_long_conversations_are_an_error_or_dropped(tokenizer):
    convs = load_conversations(DataConfig(path=str(CHAT), messages_field="messages"), "response")
    with pytest.raises(DataError, match=r"chat.jsonl:3: conversation has \d+ tokens, over sft.max_tokens=60"):
        encode_conversations(convs, tokenizer, [IM_END], max_tokens=60)
    kept = encode_conversations(convs, tokenizer, [IM_END], max_tokens=60, drop_long=True)
    assert 0 < len(kept) < len(convs) and all(len(e.ids) <= 60 for e in kept)


# ---------------------------------------------------------------- losses


def test_nll_and_dft_hand_example():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = sft_loss(lp, mask, num_tokens=2)
    assert loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert m["nll"].item() == pytest.approx(loss.item()) and m["token_prob"].item() == pytest.approx(0.375)
    loss, _ = sft_loss(lp, mask, num_tokens=2, dft=True)
    assert loss.item() == pytest.approx((0.5 * math.log(2) + 0.25 * math.log(4)) / 2)
    inf = torch.tensor([[-math.inf, math.log(0.5)]])  # a masked-out -inf neither leaks into value nor gradient
    x = inf.clone().requires_grad_(True)
    sft_token_loss(x, torch.tensor([[0.0, 1.0]]), dft=True).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[0.0, -0.5]]))


@FAST
@given(st.integers(1, 3), st.integers(1, 5), st.integers(2, 7), st.integers(0, 2**31 - 1))
def test_dft_gradient_is_token_probability_times_nll_gradient(n, length, vocab, seed):
    """Through a softmax: d DFT / d logits = p(token) * d NLL / d logits, per token."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, length, vocab, generator=gen, dtype=torch.float64) * 3)
    targets = torch.randint(vocab, (n, length), generator=gen)
    mask = (torch.rand(n, length, generator=gen) > 0.3).double()

    def grad(dft: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = logits.clone().requires_grad_(True)
        lp = torch.log_softmax(x, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        sft_token_loss(lp, mask, dft=dft).sum().backward()
        return x.grad, lp.detach().exp()

    g_nll, p = grad(False)
    g_dft, _ = grad(True)
    assert torch.allclose(g_dft, p.unsqueeze(-1) * g_nll, atol=1e-12)
    assert torch.equal(g_nll[mask == 0], torch.zeros_like(g_nll[mask == 0]))


@FAST
@given(st.lists(st.floats(-30, 0, allow_nan=False), min_size=1, max_size=12), st.integers(1, 4))
def test_dft_is_p_times_nll_and_equals_nll_as_p_goes_to_1(lps, split):
    lp = torch.tensor([lps], dtype=torch.float64)
    mask = torch.ones_like(lp)
    nll, dft = sft_token_loss(lp, mask), sft_token_loss(lp, mask, dft=True)
    assert torch.allclose(dft, lp.exp() * nll)
    assert (dft <= nll + 1e-12).all()
    near_one = lp * 1e-9  # p -> 1
    assert torch.allclose(sft_token_loss(near_one, mask, dft=True), sft_token_loss(near_one, mask), rtol=1e-6)
    # micro-batches normalised by the whole mini-batch add up to the whole's loss
    ntok = loss_normalizers(mask)["num_tokens"]
    whole = sft_loss(lp, mask, dft=True, num_tokens=ntok)[0]
    parts = sum(sft_loss(c, torch.ones_like(c), dft=True, num_tokens=ntok)[0] for c in lp.tensor_split(split, dim=1))
    assert torch.allclose(whole, parts)


# ---------------------------------------------------------------- RFT's rejection step


def test_keep_indices_hand_example():
    rewards = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, float("nan")]
    groups = [0, 0, 0, 0, 1, 1, 1]
    keys = ["a", "a", "b", "c", "x", "y", "z"]
    assert keep_indices(rewards, groups, keys, threshold=1.0, dedupe=False) == [0, 1, 3, 4, 5]
    assert keep_indices(rewards, groups, keys, threshold=1.0) == [0, 3, 4, 5]
    assert keep_indices(rewards, groups, keys, threshold=1.0, max_per_prompt=1) == [0, 4]
    assert keep_indices(rewards, groups, keys, threshold=-1.0) == [0, 2, 3, 4, 5]


@FAST
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.integers(0, 3), st.integers(0, 3)), max_size=30),
       st.sampled_from([0.0, 0.5, 1.0]), st.booleans(), st.one_of(st.none(), st.integers(1, 3)))
def test_keep_indices_properties(samples, threshold, dedupe, cap):
    rewards, groups, keys = (list(x) for x in zip(*samples)) if samples else ([], [], [])
    kept = keep_indices(rewards, groups, keys, threshold=threshold, dedupe=dedupe, max_per_prompt=cap)
    assert kept == sorted(set(kept)) and all(rewards[i] >= threshold for i in kept)
    per = [groups[i] for i in kept]
    if cap is not None:
        assert all(per.count(g) <= cap for g in set(per))
    if dedupe:
        assert len({(groups[i], keys[i]) for i in kept}) == len(kept)
    if not dedupe and cap is None:
        assert kept == [i for i, r in enumerate(rewards) if r >= threshold]
    else:  # every passing sample left out is a duplicate or over the cap
        for i, r in enumerate(rewards):
            if r >= threshold and i not in kept:
                before = [j for j in kept if j < i and groups[j] == groups[i]]
                assert (dedupe and any(keys[j] == keys[i] for j in before)) or (cap is not None and len(before) >= cap)
