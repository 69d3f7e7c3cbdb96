"""The bad-input catalog for values and files (tests/test_bad_inputs.py holds the first part; the promise
and the harness are the same): each class of input below printed a traceback, hung, or was taken silently
before its check was added.

- numbers no option can use: NaN, inf, `1e999`, integers over 64 bits (any option, any plugin
  option, a sweep range), seeds outside 0..2**32; a reply length (rollout or eval max_new_tokens)
  that with the prompt does not fit the model's context (sampling ran past it for as long as asked);
- budgets a short model cannot hold (rollout.max_prompt_tokens with the reply, engine.max_model_len:
  vLLM printed a 30-line traceback) and an explicit engine that cannot run the architecture;
- a key given twice in one YAML mapping (recipe, override value) or one JSON object (data line);
- files that are not regular files (a FIFO waits for a writer forever);
- JSON lines json refuses beyond syntax: an integer over 4300 digits, nesting too deep, half of a
  UTF-16 surrogate pair;
- rows that parse but hold nothing usable: an answer the reward cannot compare against (the
  `integer` reward never matched [4, 5] or null, so those prompts only ever scored the fallback),
  a blank prompt, a chat role no template knows, a chat without text;
- settings silently ignored: `data.split` on a single file, a tool listed twice in agent.tools (the
  second replaced the first), options that cannot act in the configuration (TIS against the sampler
  itself, an adaptive KL target with no KL, critic options without a critic estimator);
- the location of an option that takes one of several types (no pydantic member tags), regexes
  (config options and every plugin option named like a pattern);
- true/false given to a number option (pydantic's lax mode reads it as 1), config or plugin option.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from bad_input_helpers import Case, World, catalog_tests, registrar

CASES: list[Case] = []
case = registrar(CASES)


def _show(*overrides: str) -> list[str]:
    return ["config", "show", *overrides]


# ---------------------------------------------------------------- numbers

case("override_inf_float", ["optim.lr: expected a finite number (got inf)"])(lambda w: _show("optim.lr=.inf"))
case("override_float_overflow", ["optim.lr: expected a finite number"])(lambda w: _show("optim.lr=1e999"))
case("override_nan_unbounded", ["optim.beta1: expected a finite number (got nan)"])(
    lambda w: _show("optim.beta1=.nan"))
case("reward_weight_nan", ["reward[0].weight: expected a finite number"])(
    lambda w: _show("reward=[{name: integer, weight: .nan}]"))
case("plugin_options_int_over_64_bits", ["data.options: expected an integer of at most 18 digits", "at count"])(
    lambda w: _show("data.options={count: 99999999999999999999}"))
case("seed_over_generator_range", ["train.seed", "less than 4294967296"])(
    lambda w: ["train", *w.base(None, f"train.seed={2**62}")])
case("sweep_range_inf", ["optim.lr", "expected a finite number"])(
    lambda w: ["sweep", str(w.file("r.yaml", f"model:\n  name: {w.tiny}\n")), "--space",
               "optim.lr=log_uniform:1e-5:inf", "--out", str(w.tmp / "sw")])

case("override_true_as_count", ["train.steps: expected int, not true"])(lambda w: _show("train.steps=true"))
case("plugin_option_true_as_number", ["algo.policy_loss.options.eps_low: expected float, not true"])(
    lambda w: ["train", *w.base(None, "algo.policy_loss.options={eps_low: true}")])

case("reply_over_context", ["rollout.max_new_tokens=100000 is at or over the model's context of 8192 tokens"])(
    lambda w: ["train", *w.base(None, "rollout.max_new_tokens=100000")])
case("eval_reply_over_context", ["eval.max_new_tokens=9000 is at or over the model's context"])(
    lambda w: ["train", *w.base(None, "eval.max_new_tokens=9000", "train.eval_before=false")])
case("prompt_and_reply_over_context", ["prompt has", "with rollout.max_new_tokens=8190 that is", "8192"])(
    lambda w: ["train", *w.base(None, "rollout.max_new_tokens=8190")])


def _short(w: World) -> str:
    """The tiny model with a 256-token context (max_position_embeddings; its tokenizer says 8192)."""
    from model_helpers import model_with_config

    return model_with_config(w.tiny, w.tmp / "short", max_position_embeddings=256)


case("prompt_budget_over_context", ["rollout.max_prompt_tokens=512 + rollout.max_new_tokens=4 = 516",
                                    "context of 256", "at most 252"])(
    lambda w: ["train", *w.base(None, f"model.name={_short(w)}", "rollout.max_prompt_tokens=512")])
case("eval_prompt_budget_over_context", ["rollout.max_prompt_tokens=240 + eval.max_new_tokens=20", "context of 256"])(
    lambda w: ["eval", *w.base(None, f"model.name={_short(w)}", "rollout.max_prompt_tokens=240",
                               "eval.max_new_tokens=20")])
case("engine_context_over_model", ["engine.max_model_len=1024 is over the model's context of 256 tokens"])(
    lambda w: ["train", *w.base(None, f"model.name={_short(w)}", "engine.max_model_len=1024")])


def _olmo2(w: World) -> str:
    from model_helpers import tiny_olmo2

    return tiny_olmo2(w.tiny, w.tmp / "olmo2")


def _olmo2_on_vllm(w: World) -> list[str]:
    """What engine.name=vllm on OLMo 2 says: vLLM's Transformers backend cannot share the process with
    the learner (without vLLM installed: that it is not)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ["engine.name=vllm: vllm is not installed"]
    return ["engine.name=vllm: vLLM runs Olmo2ForCausalLM only through its Transformers backend", "use engine.name=hf"]


case("vllm_cannot_run_architecture", _olmo2_on_vllm)(
    lambda w: ["train", *[a for a in w.base(None, f"model.name={_olmo2(w)}") if a != "engine.name=hf"],
               "engine.name=vllm"])


def _moe(w: World, family: str = "qwen3_moe") -> str:
    from upslope.families import make_family_model

    return make_family_model(family, w.tiny, w.tmp / family)


def _replay_on_vllm(w: World) -> list[str]:
    """What routing replay with engine.name=vllm says: vLLM does not return routed experts here (without vLLM
    installed: that it is not)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ["engine.name=vllm: vllm is not installed"]
    return ["algo.routing_replay: engine.name=vllm does not return the experts it routed each token to",
            "set engine.name to one that does: hf"]


case("routing_replay_on_a_dense_model", ["algo.routing_replay: LlamaForCausalLM has no MoE routers"])(
    lambda w: ["train", *w.base(None, "algo.routing_replay=true")])
case("load_balance_on_a_dense_model", ["algo.terms[0] (load_balance): LlamaForCausalLM has no MoE routers"])(
    lambda w: ["train", *w.base(None, "algo.terms=[{name: load_balance, options: {coef: 0.01}}]")])
case("routing_replay_with_vllm", _replay_on_vllm)(
    lambda w: ["train", *[a for a in w.base(None, f"model.name={_moe(w)}") if a != "engine.name=hf"],
               "engine.name=vllm", "algo.routing_replay=true"])
case("routing_replay_with_a_router_of_another_kind",
     ["algo.routing_replay: PhimoeForCausalLM's router PhimoeTopKRouter does not return its logits and pick its "
      "experts with one top-2 over 4 expert scores"])(
    lambda w: ["train", *w.base(None, f"model.name={_moe(w, 'phimoe')}", "algo.routing_replay=true")])
case("continuous_batching_with_latent_attention",
     ["engine.name=hf_paged: DeepseekV3ForCausalLM uses multi-head latent attention", "use engine.name=hf"])(
    lambda w: ["train", *[a for a in w.base(None, f"model.name={_moe(w, 'deepseek_v3')}") if a != "engine.name=hf"],
               "engine.name=hf_paged"])
case("routing_replay_with_a_rollout_that_drops_the_experts",
     ["algo.routing_replay: rollout.kind=tree does not keep the experts", "use single_turn"])(
    lambda w: ["train", *w.base(None, f"model.name={_moe(w)}", "rollout.kind=tree", "algo.routing_replay=true")])



def _model_with_config(w: World, **changes: object) -> str:
    """A copy of the tiny model whose config.json has `changes`."""
    import shutil

    d = w.tmp / "model"
    shutil.copytree(w.tiny, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **changes}))
    return str(d)


case("model_config_field_wrong_type", lambda w: [str(w.tmp / "model" / "config.json"), "hidden_size"])(
    lambda w: ["train", *w.base(None, f"model.name={_model_with_config(w, hidden_size='big')}")])

# ---------------------------------------------------------------- locations and patterns

case("union_option_named_plainly", ["train.micro_batch_tokens: Input should be a valid integer", "'auto'"])(
    lambda w: _show("train.micro_batch_tokens=abc"))
case("eval_pattern_not_regex", ["eval.confidence_pattern", "not a regular expression"])(
    lambda w: ["eval", *w.base(None, "eval.confidence_pattern=(")])
case("reward_pattern_not_regex", ["pattern: Value error, not a regular expression", "'('"])(
    lambda w: ["train", *w.base(None, "reward=[{name: format, options: {pattern: '('}}]")])
case("plugins_command_bad_yaml", ["plugins:", "'[a'"])(lambda w: ["plugins", "plugins=[a"])

# ---------------------------------------------------------------- keys given twice


case("recipe_duplicate_key", lambda w: [f"{w.tmp / 'dup.yaml'}:3", "'train' appears twice"])(
    lambda w: ["train", str(w.file("dup.yaml", "train:\n  steps: 3\ntrain:\n  seed: 1\n"))])
case("override_duplicate_key", ["override 'data.options'", "'a' appears twice"])(
    lambda w: _show("data.options={a: 1, a: 2}"))
case("data_duplicate_key", lambda w: [f"{w.tmp / 'dup.jsonl'}:2", "'prompt' appears twice"])(
    lambda w: ["train", *w.base(None, "data.path=" + str(w.file(
        "dup.jsonl", '{"prompt": "a", "answer": 1}\n{"prompt": "a", "prompt": "b", "answer": 1}\n')))])

# ---------------------------------------------------------------- files that are not files


def _fifo(w: World, name: str) -> Path:
    p = w.tmp / name
    os.mkfifo(p)
    return p


case("data_fifo", lambda w: [str(w.tmp / "pipe.jsonl"), "not a regular file"])(
    lambda w: ["train", *w.base(None, f"data.path={_fifo(w, 'pipe.jsonl')}")])
case("recipe_fifo", lambda w: [str(w.tmp / "pipe.yaml"), "not a regular file"])(
    lambda w: ["config", "show", str(_fifo(w, "pipe.yaml"))])

# ---------------------------------------------------------------- JSON json refuses beyond syntax


def _data(id: str, line: str, expect: str) -> None:
    case(id, lambda w: [f"{w.tmp / (id + '.jsonl')}:1", expect])(
        lambda w: ["train", *w.base(None, f"data.path={w.file(id + '.jsonl', line + chr(10))}",
                                    "reward=[{name: integer}]")])


_data("data_integer_over_4300_digits", '{"prompt": "p", "answer": ' + "1" * 5000 + "}", "4300 digits")
_data("data_nested_too_deep", '{"prompt": "p", "answer": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply")
_data("data_lone_surrogate", '{"prompt": "\\ud800", "answer": 1}', "surrogate")


# ---------------------------------------------------------------- rows that parse but say nothing usable


def _chat(id: str, line: str, expect: str, command: str = "train") -> None:
    case(id, lambda w: [f"{w.tmp / (id + '.jsonl')}:1", expect])(
        lambda w: [command, *w.base(None, f"data.path={w.file(id + '.jsonl', line + chr(10))}",
                                    "data.messages_field=messages", "reward=[{name: integer}]")])


_data("data_answer_a_list", '{"prompt": "p", "answer": [4, 5]}', "answer [4, 5] cannot be checked by reward 'integer'")
_data("data_answer_null", '{"prompt": "p", "answer": null}', "answer None cannot be checked by reward 'integer'")
_data("data_prompt_blank", '{"prompt": "  \\n ", "answer": 1}', "field 'prompt' is empty")
_chat("data_message_unknown_role", '{"messages": [{"role": "wizard", "content": "hi"}], "answer": 1}',
      "role 'wizard'; expected one of system")
_chat("data_messages_without_text", '{"messages": [{"role": "user", "content": " "}], "answer": 1}',
      "no message with any text")
_chat("sft_message_unknown_role", '{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]}',
      "message 2 has role 'bot'", command="sft")
ONE_ROW = json.dumps({"prompt": "p", "answer": 1}) + "\n"
case("data_split_on_a_file", lambda w: ["data.split='test'", str(w.tmp / "one.jsonl"), "is one file"])(
    lambda w: ["train", *w.base(None, f"data.path={w.file('one.jsonl', ONE_ROW)}", "data.split=test",
                                "reward=[{name: integer}]")])
case("correction_against_the_sampler_itself", ["algo.correction has no effect with algo.old_policy=sampler"])(
    lambda w: _show("algo.correction={cap: 2.0}", "algo.old_policy=sampler"))
case("kl_target_without_kl", ["algo.kl_target needs algo.kl_coef > 0"])(lambda w: _show("algo.kl_target=0.01"))
case("critic_options_without_a_critic", ["critic options are set but algo.advantage 'grpo' uses no critic"])(
    lambda w: _show("critic.lr=1e-4"))
case("sweep_recipe_not_text", lambda w: [str(w.tmp / "s.yaml"), "recipe: Input should be a valid string"])(
    lambda w: ["sweep", str(w.file("s.yaml", "recipe: [rec.yaml]\nspace: {optim.lr: [1e-5, 2e-5]}\n")), "--out",
               str(w.tmp / "sw")])
case("agent_tool_listed_twice", ["agent.tools: tool 'calculator' is listed twice"])(
    lambda w: _show("agent.tools=[{name: calculator}, {name: calculator, options: {}}]"))


# ---------------------------------------------------------------- the harness


world_base, test_bad_input_gives_one_line = catalog_tests(CASES, "bad-inputs-more")


def test_jsonl_opening_with_a_byte_order_mark_reads(tmp_path):
    """A BOM (editors on Windows write one) is not a mistake: the first line reads as the others."""
    from upslope.data.sources import read_records

    p = tmp_path / "bom.jsonl"
    p.write_text(json.dumps({"prompt": "p", "answer": 1}) + "\n", encoding="utf-8-sig")
    assert [rec for _, rec in read_records(p)] == [{"prompt": "p", "answer": 1}]


def test_yaml_anchors_and_merges_still_read():
    """The strict loader refuses only a key written twice: a `<<` merge may override merged keys."""
    from upslope.yaml_strict import load_yaml

    assert load_yaml("a: &x {k: 1, j: 2}\nb:\n  <<: *x\n  k: 3\n") == {"a": {"k": 1, "j": 2}, "b": {"k": 3, "j": 2}}
