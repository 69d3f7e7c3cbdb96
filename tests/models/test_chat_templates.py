"""Each family's chat template through upslope's chat paths. There is no model hub here, so each
template (chat_templates/*.jinja) is written from the family's documented format and put, with the
family's special tokens and end-of-turn token (the generation config's eos, as the family ships it),
into SmolLM2's real tokenizer, saved and loaded back as a model directory. For each family:
- the SFT mask (`assistant_mask`) is 1 on exactly each assistant reply and its end-of-turn token, the ids
  decode to the template's render, and the first reply's context is the RL prompt encoding;
- the system prompt is the template's: its own turn (Llama 3, Qwen, Phi-3), merged into the first user
  turn (Gemma 3), into the last user turn (Mistral: in the RL prompt; a conversation that ends with a
  reply loses it, so an SFT conversation with one is one error line), or refused in one line naming the
  system message (Gemma 2, which has no system role);
- Qwen3's thinking: the template writes an empty `<think>` block into the last reply and drops the
  reasoning of replies before the last user message, so a multi-turn SFT conversation is one error
  line, while the multi-turn rollout keeps the ids the model sampled, thinking included;
- the multi-turn rollout's continuation after a model turn renders the environment's messages as the
  template does, so a row of recorded turns decodes to the template's render of the conversation."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from upslope.config import AgentConfig, Plugin
from upslope.data.chat import assistant_mask
from upslope.data.prompts import encode_prompts
from upslope.data.tasks import arith
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.models import load_tokenizer, stop_token_ids
from upslope.rollout.multi_turn import AgentRun

TEMPLATES = Path(__file__).with_name("chat_templates")


@dataclass(frozen=True)
class ChatFamily:
    """A family's chat format: its template file, special tokens, and how a reply and a prompt read."""

    specials: tuple[str, ...]  # special tokens the template writes (added to the tokenizer)
    eos: str  # the tokenizer's eos
    end: str  # the end of an assistant turn (the generation config's eos)
    reply: str  # the trained text of a reply with content {c} (stripped)
    prompt: str  # the RL prompt of system {s} and user {u} (add_generation_prompt)
    bos: str | None = None


FAMILIES = {
    "llama3": ChatFamily(("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                          "<|eot_id|>"), eos="<|eot_id|>", end="<|eot_id|>", bos="<|begin_of_text|>",
                         reply="{c}<|eot_id|>",
                         prompt="<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{s}<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\n{u}<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "qwen2_5": ChatFamily(("<|im_start|>", "<|im_end|>", "<|endoftext|>"), eos="<|im_end|>", end="<|im_end|>",
                          reply="{c}<|im_end|>",
                          prompt="<|im_start|>system\n{s}<|im_end|>\n<|im_start|>user\n{u}<|im_end|>\n"
                                 "<|im_start|>assistant\n"),
    "qwen3": ChatFamily(("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"), eos="<|im_end|>",
                        end="<|im_end|>", reply="<think>\n\n</think>\n\n{c}<|im_end|>",
                        prompt="<|im_start|>system\n{s}<|im_end|>\n<|im_start|>user\n{u}<|im_end|>\n"
                               "<|im_start|>assistant\n"),
    "gemma2": ChatFamily(("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), eos="<eos>", end="<end_of_turn>",
                         bos="<bos>", reply="{c}<end_of_turn>", prompt=""),
    "gemma3": ChatFamily(("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), eos="<eos>", end="<end_of_turn>",
                         bos="<bos>", reply="{c}<end_of_turn>",
                         prompt="<bos><start_of_turn>user\n{s}\n\n{u}<end_of_turn>\n<start_of_turn>model\n"),
    "mistral": ChatFamily(("<s>", "</s>", "[INST]", "[/INST]"), eos="</s>", end="</s>", bos="<s>",
                          reply=" {c}</s>", prompt="<s>[INST] {s}\n\n{u}[/INST]"),
    "phi3": ChatFamily(("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
                       eos="<|endoftext|>", end="<|end|>", reply="{c}<|end|>",
                       prompt="<|system|>\n{s}<|end|>\n<|user|>\n{u}<|end|>\n<|assistant|>\n"),
}
NAMES = list(FAMILIES)
SYSTEM_REFUSED = {"gemma2"}  # no system role: the template raises
SYSTEM_MOVES = {"mistral"}  # the system message joins the last message when it is a user turn
REWRITES_EARLIER_TURNS = {"qwen3"}  # earlier replies lose their thinking

TWO_TURNS = [{"role": "user", "content": "What is 6 * 9?"}, {"role": "assistant", "content": "54"},
             {"role": "user", "content": "And 6 * 8?"}, {"role": "assistant", "content": "48"}]


@pytest.fixture(scope="module")
def family_chat(smollm_path, tmp_path_factory):
    """name -> (tokenizer, stop ids) of a saved model directory: SmolLM2's tokenizer with the family's
    special tokens, eos and chat template, and a generation config naming its end-of-turn token."""
    made: dict[str, tuple[object, list[int]]] = {}

    def get(name: str):
        if name not in made:
            fam = FAMILIES[name]
            tok = load_tokenizer(smollm_path)
            tok.add_special_tokens({"additional_special_tokens": list(fam.specials)})
            tok.eos_token = fam.eos
            if fam.bos:
                tok.bos_token = fam.bos
            tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
            path = tmp_path_factory.mktemp(name)
            tok.save_pretrained(path)
            ids = sorted({tok.convert_tokens_to_ids(fam.eos), tok.convert_tokens_to_ids(fam.end)})
            (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
            loaded = load_tokenizer(str(path))
            made[name] = (loaded, stop_token_ids(loaded, str(path)))
        return made[name]
    return get


def trained_runs(tok, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded maximal runs of trained tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return [tok.decode(r) for r in runs + ([cur] if cur else [])]


@pytest.mark.parametrize("name", NAMES)
def test_the_mask_is_exactly_each_reply_and_its_end_of_turn_token(name, family_chat):
    tok, stops = family_chat(name)
    fam = FAMILIES[name]
    assert tok.convert_tokens_to_ids(fam.end) in stops  # the generation config's end-of-turn token stops
    conversations = [TWO_TURNS[:2]] + ([] if name in REWRITES_EARLIER_TURNS else [TWO_TURNS])
    for messages in conversations:
        ids, mask = assistant_mask(messages, tok, stops, where=name)
        render = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(ids) == render
        replies = [m["content"].strip() for m in messages if m["role"] == "assistant"]
        assert trained_runs(tok, ids, mask) == [fam.reply.format(c=r) for r in replies]
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert all(m["content"] in untrained for m in messages if m["role"] == "user")
        first = mask.index(1)
        (prompt,), _ = encode_prompts([Example(prompt=messages[:1])], tok)
        assert ids[:first] == prompt  # the first reply's context is the RL prompt, token for token


@pytest.mark.parametrize("name", NAMES)
def test_the_system_prompt_is_the_templates(name, family_chat):
    tok, stops = family_chat(name)
    fam = FAMILIES[name]
    ex = Example(prompt="What is 7 * 8?")
    if name in SYSTEM_REFUSED:
        with pytest.raises(DataError) as err:
            encode_prompts([ex], tok, system_prompt="Be brief.")
        line = str(err.value)
        assert "\n" not in line and "System role not supported" in line and "data.system_prompt" in line
        with pytest.raises(DataError, match="System role not supported"):
            assistant_mask(ex.messages("Be brief.") + [{"role": "assistant", "content": "56"}], tok, stops)
        return
    (prompt,), _ = encode_prompts([ex], tok, system_prompt="Be brief.")
    assert tok.decode(prompt) == fam.prompt.format(s="Be brief.", u="What is 7 * 8?")
    if name in SYSTEM_MOVES:  # once the reply follows, no user turn is last: the system message is gone
        rendered = tok.apply_chat_template(ex.messages("Be brief.") + [{"role": "assistant", "content": "56"}],
                                           tokenize=False)
        assert "Be brief." not in rendered
        with pytest.raises(DataError, match=f"^{name}: the chat template is not prefix-stable"):
            assistant_mask(ex.messages("Be brief.") + [{"role": "assistant", "content": "56"}], tok, stops, where=name)
        return
    ids, mask = assistant_mask(ex.messages("Be brief.") + [{"role": "assistant", "content": "56"}], tok, stops)
    assert ids[:mask.index(1)] == prompt and trained_runs(tok, ids, mask) == [fam.reply.format(c="56")]
    with_system = [{"role": "system", "content": "Be brief."}] + TWO_TURNS
    if name in REWRITES_EARLIER_TURNS:
        with pytest.raises(DataError, match=f"^{name}: the chat template is not prefix-stable"):
            assistant_mask(with_system, tok, stops, where=name)
    else:
        ids, mask = assistant_mask(with_system, tok, stops)
        assert trained_runs(tok, ids, mask) == [fam.reply.format(c="54"), fam.reply.format(c="48")]


def test_qwen3_thinking_is_trained_in_the_last_reply_and_earlier_replies_are_refused(family_chat):
    """The reply's <think> block is part of what the model writes (trained); the template drops it from
    replies before the last user message, so a multi-turn conversation cannot be masked: one line."""
    tok, stops = family_chat("qwen3")
    thought = [{"role": "user", "content": "What is 6 * 9?"},
               {"role": "assistant", "content": "<think>\n6 * 9 = 54\n</think>\n\n54"}]
    ids, mask = assistant_mask(thought, tok, stops)
    assert trained_runs(tok, ids, mask) == ["<think>\n6 * 9 = 54\n</think>\n\n54<|im_end|>"]
    assert tok.decode(ids[:mask.index(1)]).endswith("<|im_start|>assistant\n")
    rendered = tok.apply_chat_template(thought + TWO_TURNS[2:], tokenize=False)
    assert "6 * 9 = 54" not in rendered  # the earlier reply's thinking is gone from the template's render
    with pytest.raises(DataError) as err:
        assistant_mask(thought + TWO_TURNS[2:], tok, stops, where="row 7")
    assert str(err.value).startswith("row 7: the chat template is not prefix-stable") and "\n" not in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_multi_turn_rows_of_recorded_turns_render_as_the_template(name, family_chat):
    """A trajectory of model turns (the ids the mask trains: what the model writes, end-of-turn token
    included) and the environment's user messages (`AgentRun.continuation`) decodes to the template's
    render of the conversation; for Qwen3, to it with the first turn's thinking kept where the model
    wrote it (the template's re-render would drop it, the recorded ids keep it)."""
    tok, stops = family_chat(name)
    run = AgentRun(AgentConfig(env=Plugin(name="answer", options={"hints": 1})), tok)
    [example] = arith(count=1)
    example = replace(example, prompt="What is 6 * 9?")
    traj = run.start(example, 0)
    thinking = "<think>\nmaybe 56\n</think>\n\n" if name == "qwen3" else ""
    history = list(traj.history)
    row = list(traj.prompt)
    for content, user in ((thinking + "56", "Try again."), ("54", None)):
        history.append({"role": "assistant", "content": content})
        ids, mask = assistant_mask([{"role": "user", "content": "q"}, history[-1]], tok, stops)
        turn = ids[mask.index(1):][:sum(mask)]  # what the model writes: the reply and its end-of-turn token
        assert turn[-1] == tok.convert_tokens_to_ids(FAMILIES[name].end)
        row += turn
        if user:
            history.append({"role": "user", "content": user})
            row += run.continuation([history[-1]], turn[-1])
    text = tok.decode(row)
    render = tok.apply_chat_template(history, tokenize=False)
    if thinking:
        assert thinking not in render and text.count(thinking) == 1
        text = text.replace(thinking, "", 1)
    assert render.startswith(text) and render[len(text):].strip() in ("", FAMILIES[name].eos)
    cut = run.continuation([{"role": "user", "content": "Try again."}], None)  # a cut turn gets the closing
    assert tok.decode(cut).startswith(FAMILIES[name].end)
