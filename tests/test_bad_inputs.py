"""The bad-input catalog: every malformed input a user can give (recipe, override, model,
tokenizer, template, data file, reward module, checkpoint, run directory, export target) ends
the command with exit code 2 and exactly one stderr line `upslope: error: ...` that names the
file, line or option at fault, never a traceback, and leaves what was saved before unchanged.

The cases call the real CLI entry in-process (`upslope.cli.main`) on the tiny real model; a
handful also run as a real `python -m upslope.cli` subprocess to show the installed command
behaves the same.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from bad_input_helpers import Case, World, catalog_tests, registrar, snapshot
from markers import IN_CI_SLOW_SET

from upslope.cli import main

REPO = Path(__file__).resolve().parents[1]

CASES: list[Case] = []
case = registrar(CASES)


# ---------------------------------------------------------------- command line and recipes

case("unknown_command", ["unknown command 'trian'"])(lambda w: ["trian"])
case("two_recipes", ["unexpected argument"])(lambda w: ["train", str(w.file("a.yaml", "{}")), "b.yaml"])
case("config_no_subcommand", ["upslope config show"])(lambda w: ["config"])
case("config_bad_subcommand", ["upslope config show"])(lambda w: ["config", "list"])
case("recipe_missing", lambda w: [str(w.tmp / "none.yaml"), "not found"])(lambda w: ["train", str(w.tmp / "none.yaml")])
case("recipe_is_directory", lambda w: [str(w.tmp / "adir"), "directory"])(
    lambda w: ["train", str((w.tmp / "adir").mkdir() or w.tmp / "adir")])
case("recipe_binary", lambda w: [str(w.tmp / "bin.yaml")])(
    lambda w: ["train", str(w.file("bin.yaml", bytes(range(256)) * 4))])
case("recipe_not_utf8", lambda w: [str(w.tmp / "latin.yaml"), "UTF-8"])(
    lambda w: ["train", str(w.file("latin.yaml", "run_dir: caf\xe9\n".encode("latin-1")))])
case("recipe_invalid_yaml", lambda w: [f"{w.tmp / 'bad.yaml'}:3", "invalid YAML"])(
    lambda w: ["train", str(w.file("bad.yaml", "train:\n  steps: [1, 2\nrollout: {}\n"))])
case("recipe_top_level_list", lambda w: [str(w.tmp / "list.yaml"), "mapping"])(
    lambda w: ["train", str(w.file("list.yaml", "- a\n- b\n"))])
case("recipe_top_level_scalar", lambda w: [str(w.tmp / "scalar.yaml"), "mapping"])(
    lambda w: ["train", str(w.file("scalar.yaml", "just text\n"))])
case("recipe_unknown_key", lambda w: [str(w.tmp / "unk.yaml"), "train.stepz"])(
    lambda w: ["train", str(w.file("unk.yaml", "train:\n  stepz: 3\n"))])
case("recipe_wrong_type", lambda w: [str(w.tmp / "type.yaml"), "train.steps"])(
    lambda w: ["train", str(w.file("type.yaml", "train:\n  steps: many\n"))])
case("recipe_section_not_mapping", lambda w: [str(w.tmp / "sect.yaml"), "train"])(
    lambda w: ["train", str(w.file("sect.yaml", "train: 5\n"))])
case("recipe_base_missing", lambda w: ["nothere.yaml", "not found"])(
    lambda w: ["train", str(w.file("child.yaml", "base: nothere.yaml\n"))])
case("recipe_base_loop", ["loops back"])(
    lambda w: ["train", str(w.file("loop.yaml", "base: loop.yaml\n"))])
case("recipe_base_not_text", lambda w: [str(w.tmp / "basel.yaml"), "base"])(
    lambda w: ["train", str(w.file("basel.yaml", "base: [a.yaml]\n"))])
case("recipe_base_is_directory", lambda w: [str(w.tmp / "bdir"), "directory"])(
    lambda w: ["train", str((w.tmp / "bdir").mkdir() or w.file("based.yaml", "base: bdir\n"))])
case("recipe_empty_key_override", ["unknown key"])(lambda w: ["config", "show", "=5"])
case("override_unknown_key", ["did you mean 'train.steps'"])(lambda w: ["config", "show", "train.stepz=3"])
case("override_negative_steps", ["train.steps"])(lambda w: ["config", "show", "train.steps=-1"])
case("override_into_scalar", ["train.steps"])(lambda w: ["config", "show", "train.steps.x=1"])
case("override_bad_literal", ["engine.name"])(lambda w: ["config", "show", "engine.name=fast"])
case("override_bad_float", ["optim.lr"])(lambda w: ["config", "show", "optim.lr=fast"])
case("override_top_p_range", ["rollout.top_p"])(lambda w: ["config", "show", "rollout.top_p=2"])
case("override_dtype_precision", ["model.dtype"])(
    lambda w: ["config", "show", "train.precision=float32", "model.dtype=bfloat16"])
case("lora_targets_empty", ["lora.target_modules"])(lambda w: ["config", "show", "lora.target_modules=[]"])
case("unknown_task", ["data.task"])(lambda w: ["config", "show", "data.task=arithmetic"])
case("export_arg_count", ["usage: upslope export"])(lambda w: ["export", "only_one"])
case("export_override", ["usage: upslope export"])(lambda w: ["export", "a", "b=c"])


# ---------------------------------------------------------------- options checked at start


def _opt(id: str, expect: list[str], *extra: str) -> None:
    case(id, expect)(lambda w: ["train", *w.base(None, *extra)])


_opt("group_advantage_n1", ["rollout.n"], "rollout.n=1")
_opt("advantage_unknown", ["did you mean 'grpo'"], "algo.advantage.name=grpoo")
_opt("advantage_option_unknown", ["scale_by_sdt"], "algo.advantage.options={scale_by_sdt: false}")
_opt("policy_loss_unknown", ["algo.policy_loss"], "algo.policy_loss.name=ppo_clap")
_opt("filter_unknown", ["algo.filters"], "algo.filters=[{name: nonzero}]")
_opt("kl_estimator_unknown", ["algo.kl_estimator"], "algo.kl_coef=0.1", "algo.kl_estimator=k9")
_opt("combiner_unknown", ["algo.reward_combiner"], "algo.reward_combiner.name=prod")
_opt("task_option_unknown", ["data.options", "digitz"], "data.options={digitz: 2}")
_opt("task_option_bad_ops", ["data.options.ops"], "data.options={ops: '/'}")
_opt("task_template_unknown_field", ["data.template", "question"], "data.template='Q: {question}'")
_opt("task_template_unbalanced", ["data.template"], "data.template='Q: {prompt'")
_opt("task_template_positional", ["data.template"], "data.template='Q: {0}'")
_opt("reward_unknown", ["reward[0].name"], "reward=[{name: integr}]")
_opt("reward_option_unknown", ["reward[0].options"], "reward=[{name: integer, options: {extrakt: last}}]")
_opt("reward_ref_no_colon", ["reward"], "reward=[{name: 'mymodule.fn'}]")
_opt("reward_module_missing", ["no_such_mod_xyz"], "reward=[{name: 'no_such_mod_xyz:fn'}]")
_opt("updates_over_groups", ["train.updates_per_batch"], "train.updates_per_batch=3")
_opt("eval_k_over_n", ["eval.k"], "train.eval_before=true", "eval.k=[4]")
_opt("lora_target_unknown", ["lora.target_modules", "qq_proj"], "lora.enabled=true", "lora.target_modules=[qq_proj]")
_opt("resume_latest_none", ["train.resume=latest"], "train.resume=latest")
_opt("gsm8k_path_missing", ["/nonexistent/gsm.jsonl"], "data.task=gsm8k", "data.options={path: /nonexistent/gsm.jsonl}")


def _reward_file(name: str, body: str, expect: list[str] | Callable[[World], list[str]], fn: str = "score") -> None:
    case(name, expect)(lambda w: ["train", *w.base(None, f"reward=[{{name: '{w.file(name + '.py', body)}:{fn}'}}]")])


_reward_file("reward_syntax_error", "def score(c, a, m)\n    return 1\n",
             lambda w: [f"{w.tmp / 'reward_syntax_error.py'}:1", "SyntaxError"])
_reward_file("reward_import_raises", "import no_such_package_xyz\n", ["reward_import_raises.py", "no_such_package_xyz"])
_reward_file("reward_function_missing", "def other(c, a, m):\n    return 1\n", ["no function 'score'"])
_reward_file("reward_not_callable", "score = 3\n", ["no function 'score'"])
_reward_file("reward_no_params", "def score():\n    return 1\n", ["signature"])
_reward_file("reward_binary_module", "\x00\x01\x02binary", ["reward_binary_module.py"])
_reward_file("reward_always_raises", "def score(c, a, m):\n    raise KeyError('nope')\n",
             ["failed on every sample", "KeyError"])
_reward_file("reward_returns_text", "def score(c, a, m):\n    return 'yes'\n", ["failed on every sample", "'yes'"])
case("reward_file_missing", lambda w: [str(w.tmp / "gone.py")])(
    lambda w: ["train", *w.base(None, f"reward=[{{name: '{w.tmp / 'gone.py'}:fn'}}]")])
EVAL_RAISES = "def score(c, a, m):\n    raise KeyError(1)\n"
case("eval_reward_always_raises", ["failed on every sample", "reward 'score'"])(
    lambda w: ["eval", *w.base(None, f"reward=[{{name: '{w.file('evr.py', EVAL_RAISES)}:score'}}]")])


# ---------------------------------------------------------------- models, tokenizers, templates


def _model_dir(w: World, name: str, files: dict[str, str | bytes]) -> Path:
    d = w.tmp / name
    d.mkdir()
    for f, content in files.items():
        (d / f).write_bytes(content if isinstance(content, bytes) else content.encode())
    return d


def _tiny_file(w: World, name: str) -> bytes:
    return (Path(w.tiny) / name).read_bytes()


def _model_case(id: str, expect: list[str] | Callable[[World], list[str]], make: Callable[[World], str],
                command: str = "train") -> None:
    case(id, expect)(lambda w: [command, *w.base(None, f"model.name={make(w)}")])


_model_case("model_missing_path", ["model.name=/no/such/model"], lambda w: "/no/such/model")
_model_case("model_empty_dir", ["no config.json"], lambda w: str(_model_dir(w, "empty_model", {})))
_model_case("model_only_config", lambda w: [str(w.tmp / "only_config")],
            lambda w: str(_model_dir(w, "only_config", {"config.json": _tiny_file(w, "config.json")})))
_model_case("model_broken_config", lambda w: [str(w.tmp / "broken_config" / "config.json")],
            lambda w: str(_model_dir(w, "broken_config", {"config.json": '{"model_type": "llama", ',
                                                          "tokenizer.json": _tiny_file(w, "tokenizer.json")})))
_model_case("model_config_not_object", lambda w: [str(w.tmp / "list_config" / "config.json")],
            lambda w: str(_model_dir(w, "list_config", {"config.json": "[1, 2]"})))
_model_case("model_unknown_type", lambda w: [str(w.tmp / "alien")],
            lambda w: str(_model_dir(w, "alien", {"config.json": '{"model_type": "alien9000"}'})))
_model_case("model_no_tokenizer", lambda w: [str(w.tmp / "no_tok")],
            lambda w: str(_model_dir(w, "no_tok", {"config.json": _tiny_file(w, "config.json"),
                                                   "model.safetensors": _tiny_file(w, "model.safetensors")})))
_model_case("model_truncated_weights", lambda w: [str(w.tmp / "trunc_w")],
            lambda w: str(_model_dir(w, "trunc_w", {**{f: _tiny_file(w, f) for f in
                                                       ("config.json", "tokenizer.json", "tokenizer_config.json")},
                                                    "model.safetensors": _tiny_file(w, "model.safetensors")[:5000]})))
_model_case("model_weights_garbage", lambda w: [str(w.tmp / "garbage_w")],
            lambda w: str(_model_dir(w, "garbage_w", {**{f: _tiny_file(w, f) for f in
                                                         ("config.json", "tokenizer.json", "tokenizer_config.json")},
                                                      "model.safetensors": b"\xff" * 4096})))
_model_case("model_not_gguf_file", lambda w: [str(w.tmp / "weights.bin")],
            lambda w: str(w.file("weights.bin", b"\x00" * 100)))
_model_case("gguf_truncated", lambda w: [str(w.tmp / "trunc.gguf")],
            lambda w: str(w.file("trunc.gguf", b"GGUF\x03\x00\x00\x00" + b"\x00" * 40)))
_model_case("gguf_garbage", lambda w: [str(w.tmp / "garbage.gguf")],
            lambda w: str(w.file("garbage.gguf", os.urandom(2048))))
_model_case("gguf_empty", lambda w: [str(w.tmp / "empty.gguf")], lambda w: str(w.file("empty.gguf", b"")))
_model_case("gguf_two_in_dir", ["model.gguf_file"],
            lambda w: str(_model_dir(w, "two_gguf", {"a.gguf": b"x", "b.gguf": b"y"})))
case("gguf_file_missing_in_dir", lambda w: ["nope.gguf"])(
    lambda w: ["train", *w.base(None, f"model.name={_model_dir(w, 'g_dir', {'a.gguf': b'x'})}",
                                "model.gguf_file=nope.gguf")])
_model_case("model_eval_only_config", lambda w: [str(w.tmp / "only_config_e")],
            lambda w: str(_model_dir(w, "only_config_e", {"config.json": _tiny_file(w, "config.json")})), "eval")


def _template_case(id: str, expect: list[str] | Callable[[World], list[str]], template: Callable[[World], str]) -> None:
    case(id, expect)(lambda w: ["train", *w.base(None, f"model.chat_template={template(w)}")])


_template_case("template_syntax_error", ["model.chat_template", "line 1"],
               lambda w: "'{% for m in messages %}{{ m.content }'")
_template_case("template_unclosed_block", ["model.chat_template"], lambda w: "'{% for m in messages %}{{ m.content }}'")
_template_case("template_file_missing", lambda w: [str(w.tmp / "missing.jinja"), "not found"],
               lambda w: str(w.tmp / "missing.jinja"))
_template_case("template_file_syntax", lambda w: [str(w.tmp / "t.jinja"), "line 2"],
               lambda w: str(w.file("t.jinja", "{% for m in messages %}\n{{ m.content }\n{% endfor %}")))
_template_case("template_file_binary", lambda w: [str(w.tmp / "b.jinja")],
               lambda w: str(w.file("b.jinja", b"\xff\xfe\x00\x81" * 50)))
_template_case("template_path_is_dir", lambda w: [str(w.tmp / "tdir"), "directory"],
               lambda w: str((w.tmp / "tdir").mkdir() or w.tmp / "tdir"))
_template_case("template_runtime_error", ["model.chat_template"],
               lambda w: "'{{ raise_exception(\"no\") }}'")


# ---------------------------------------------------------------- data files


def _data_case(id: str, expect: list[str] | Callable[[World], list[str]], make: Callable[[World], Path | str],
               *extra: str, key: str = "data.path", command: str = "train") -> None:
    case(id, expect)(lambda w: [command, *w.base(None, f"{key}={make(w)}", *extra)])


ROW = {"prompt": "What is 2 + 2?", "answer": 4}
_data_case("data_missing", ["/no/such/data.jsonl", "not found"], lambda w: "/no/such/data.jsonl")
_data_case("data_binary_jsonl", lambda w: [str(w.tmp / "bin.jsonl")], lambda w: w.file("bin.jsonl", os.urandom(300)))
_data_case("data_not_utf8", lambda w: [f"{w.tmp / 'latin.jsonl'}:2", "UTF-8"],
           lambda w: w.file("latin.jsonl",
                            (json.dumps(ROW) + "\n" + '{"prompt": "caf\xe9", "answer": 1}\n').encode("latin-1")))
_data_case("data_invalid_json", lambda w: [f"{w.tmp / 'bad.jsonl'}:2", "invalid JSON"],
           lambda w: w.file("bad.jsonl", json.dumps(ROW) + "\n{not json}\n"))
_data_case("data_json_array_line", lambda w: [f"{w.tmp / 'arr.jsonl'}:1", "JSON object"],
           lambda w: w.file("arr.jsonl", "[1, 2]\n"))
_data_case("data_missing_prompt", lambda w: [f"{w.tmp / 'q.jsonl'}:1", "'prompt'"],
           lambda w: w.jsonl("q.jsonl", [{"query": "x", "answer": 1}]))  # a 'question' is detected as the prompt
_data_case("data_missing_answer", lambda w: [f"{w.tmp / 'na.jsonl'}:1", "'answer'"],
           lambda w: w.jsonl("na.jsonl", [{"prompt": "x"}]))
_data_case("data_prompt_not_text", lambda w: [f"{w.tmp / 'num.jsonl'}:1", "'prompt'"],
           lambda w: w.jsonl("num.jsonl", [{"prompt": 5, "answer": 1}]))
_data_case("data_bad_messages", lambda w: [f"{w.tmp / 'm.jsonl'}:1", "'messages'"],
           lambda w: w.jsonl("m.jsonl", [{"messages": "hi", "answer": 1}]), "data.messages_field=messages")
_data_case("data_empty", lambda w: [str(w.tmp / "empty.jsonl"), "no examples"], lambda w: w.file("empty.jsonl", ""))
_data_case("data_unknown_format", lambda w: [str(w.tmp / "d.tsv"), "unknown data format"],
           lambda w: w.file("d.tsv", "prompt\tanswer\n"))
_data_case("data_fake_parquet", lambda w: [str(w.tmp / "fake.parquet"), "Parquet"],
           lambda w: w.file("fake.parquet", json.dumps(ROW) + "\n"))
_data_case("data_truncated_parquet", lambda w: [str(w.tmp / "cut.parquet"), "Parquet"],
           lambda w: w.file("cut.parquet", _parquet_bytes()[:-30]))
_data_case("data_parquet_missing_field", lambda w: [f"{w.tmp / 'p.parquet'}:row 1", "'prompt'"],
           lambda w: w.file("p.parquet", _parquet_bytes(prompt_key="query")))
_data_case("data_fake_gzip", lambda w: [str(w.tmp / "fake.jsonl.gz"), "gzip"],
           lambda w: w.file("fake.jsonl.gz", json.dumps(ROW) + "\n"))
_data_case("data_gzip_truncated", lambda w: [str(w.tmp / "cut.jsonl.gz")],
           lambda w: w.file("cut.jsonl.gz", gzip.compress((json.dumps(ROW) + "\n").encode() * 50)[:-20]))
_data_case("data_dir_without_files", lambda w: [str(w.tmp / "ddir")],
           lambda w: (w.tmp / "ddir").mkdir() or w.tmp / "ddir")
_data_case("data_dir_with_fake_parquet", lambda w: [str(w.tmp / "pdir" / "train.parquet"), "Parquet"],
           lambda w: (w.tmp / "pdir").mkdir() or w.file("pdir/train.parquet", b"not parquet") and w.tmp / "pdir")
_data_case("data_template_missing_field", lambda w: [f"{w.tmp / 't.jsonl'}:1", "data.template", "hint"],
           lambda w: w.jsonl("t.jsonl", [ROW]), "data.template='{prompt} {hint}'")
_data_case("data_template_bad_format", ["data.template"], lambda w: w.jsonl("t2.jsonl", [ROW]),
           "data.template='{prompt'")
_data_case("data_prompt_too_long", lambda w: [f"{w.tmp / 'long.jsonl'}:2", "rollout.max_prompt_tokens"],
           lambda w: w.jsonl("long.jsonl", [ROW, {"prompt": "word " * 600, "answer": 1}]))
_data_case("data_prompt_over_context", lambda w: [f"{w.tmp / 'ctx.jsonl'}:1", "context"],
           lambda w: w.jsonl("ctx.jsonl", [{"prompt": "word " * 9000, "answer": 1}]), "reward=[{name: integer}]")
_data_case("eval_data_missing", ["/no/eval.jsonl"], lambda w: "/no/eval.jsonl", key="eval.data.path", command="eval")
_data_case("eval_data_binary", lambda w: [str(w.tmp / "evbin.jsonl")],
           lambda w: w.file("evbin.jsonl", b"\x00\xff" * 99),
           key="eval.data.path", command="eval")
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
# a chat list under the default `prompt` column is read as TRL's conversational layout; under a prompt
# field the user named, it is an error naming messages_field
_data_case("data_prompt_is_chat", lambda w: [f"{w.tmp / 'chat.jsonl'}:1", "got a list (chat messages?)",
                                             "set data.messages_field=question"],
           lambda w: w.jsonl("chat.jsonl", [{"question": CHAT, "answer": 4}]), "data.prompt_field=question")
_data_case("eval_data_path_alone_is_chat", lambda w: [f"{w.tmp / 'evchat.jsonl'}:1",
                                                      "set eval.data.messages_field=question"],
           lambda w: w.jsonl("evchat.jsonl", [{"question": CHAT, "answer": 4}]), "eval.data.prompt_field=question",
           key="eval.data", command="eval")
_data_case("sft_missing_messages", lambda w: [f"{w.tmp / 'sft.jsonl'}:1", "messages"],
           lambda w: w.jsonl("sft.jsonl", [{"text": "hi"}]), "data.messages_field=messages", command="sft")
_data_case("sft_binary", lambda w: [str(w.tmp / "sft.bin.jsonl")],
           lambda w: w.file("sft.bin.jsonl", os.urandom(256)), "data.messages_field=messages", command="sft")
_data_case("dpo_missing_chosen", lambda w: [f"{w.tmp / 'pairs.jsonl'}:1", "chosen"],
           lambda w: w.jsonl("pairs.jsonl", [{"prompt": "p", "rejected": "r"}]), "dpo.source=dataset",
           key="dpo.path", command="dpo")
case("dpo_dataset_without_path", ["dpo.path"])(lambda w: ["dpo", *w.base(None, "dpo.source=dataset")])


_data_case("sft_no_assistant", lambda w: [f"{w.tmp / 'sft_user.jsonl'}:1", "assistant"],
           lambda w: w.jsonl("sft_user.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}]),
           "data.messages_field=messages", command="sft")
_data_case("sft_too_long", lambda w: [f"{w.tmp / 'sft_long.jsonl'}:1", "sft.max_tokens"],
           lambda w: w.jsonl("sft_long.jsonl", [{"messages": [{"role": "user", "content": "word " * 300},
                                                              {"role": "assistant", "content": "ok"}]}]),
           "data.messages_field=messages", "sft.max_tokens=64", command="sft")
_data_case("rft_data_not_utf8", lambda w: [f"{w.tmp / 'rft.jsonl'}:1", "UTF-8"],
           lambda w: w.file("rft.jsonl", '{"prompt": "\xff", "answer": 1}\n'.encode("latin-1")), command="rft")
_data_case("hf_dir_broken", lambda w: [str(w.tmp / "hfdir")],
           lambda w: (w.tmp / "hfdir").mkdir() or w.file("hfdir/dataset_dict.json", "{broken") and w.tmp / "hfdir")
case("distill_teacher_missing", ["distill.teacher"])(
    lambda w: ["distill", *w.base(None, "distill.teacher=/no/teacher")])
case("distill_teacher_only_config", lambda w: [str(w.tmp / "teach")])(
    lambda w: ["distill", *w.base(None, "distill.teacher="
                                  f"{_model_dir(w, 'teach', {'config.json': _tiny_file(w, 'config.json')})}")])
case("critic_model_missing", ["/no/critic"])(
    lambda w: ["train", *w.base(None, "algo.advantage.name=gae", "critic.model=/no/critic")])
case("run_dir_holds_earlier_run", lambda w: [str(w.run), "train.resume=latest"], keep=lambda w: [w.run])(
    lambda w: ["train", *w.base(w.run)])
case("eval_output_not_ours", lambda w: [str(w.tmp / "evrun" / "eval_summary.json")],
     keep=lambda w: [w.tmp / "evrun"])(
    lambda w: ["eval", *w.base(w.file("evrun/eval_summary.json", "my own notes").parent)])


def _parquet_bytes(prompt_key: str = "prompt") -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({prompt_key: ["What is 2 + 2?"] * 20, "answer": [4] * 20}), buf)
    return buf.getvalue()


# ---------------------------------------------------------------- checkpoints and resume


def _resume_case(id: str, expect: Callable[[World], list[str]], damage: Callable[[World, Path], None],
                 *extra: str) -> None:
    def build(w: World) -> list[str]:
        ck = w.copy_ckpt(id)
        damage(w, ck)
        return ["train", *w.base(None, f"train.resume={ck}", "train.steps=3", *extra)]
    case(id, expect)(build)


_resume_case("resume_not_checkpoint", lambda w: [str(w.tmp / "resume_not_checkpoint"), "train.resume"],
             lambda w, ck: (ck / "COMPLETE").unlink())
_resume_case("resume_truncated_weights", lambda w: [str(w.tmp / "resume_truncated_weights")],
             lambda w, ck: _truncate(ck / "model" / "model.safetensors"))
_resume_case("resume_corrupt_trainer_state", lambda w: [str(w.tmp / "resume_corrupt_trainer_state"), "trainer.pt"],
             lambda w, ck: (ck / "trainer.pt").write_bytes(b"\x80\x04garbage"))
_resume_case("resume_truncated_trainer_state", lambda w: [str(w.tmp / "resume_truncated_trainer_state"), "trainer.pt"],
             lambda w, ck: _truncate(ck / "trainer.pt"))
_resume_case("resume_missing_trainer_state", lambda w: [str(w.tmp / "resume_missing_trainer_state"), "trainer.pt"],
             lambda w, ck: (ck / "trainer.pt").unlink())
_resume_case("resume_other_model", lambda w: [str(w.tmp / "resume_other_model"), "another model"],
             lambda w, ck: _swap_model(w, ck))
_resume_case("resume_lora_mismatch", lambda w: [str(w.tmp / "resume_lora_mismatch"), "lora.enabled"],
             lambda w, ck: None, "lora.enabled=true")
_resume_case("resume_past_steps", lambda w: [str(w.tmp / "resume_past_steps"), "train.steps"],
             lambda w, ck: None, "train.steps=1")


def _damaged_latest(w: World) -> list[str]:
    """A run whose only checkpoint lost its weights and whose `latest` pointer is binary."""
    run = w.tmp / "latest_run"
    shutil.copytree(w.run / "checkpoints", run / "checkpoints")
    (run / "checkpoints" / "latest").write_bytes(b"\xff\x00\xfe")
    _truncate(run / "checkpoints" / "step_000001" / "model" / "model.safetensors")
    return ["train", *w.base(run, "train.resume=latest", "train.steps=3")]


case("resume_latest_damaged", lambda w: [str(w.tmp / "latest_run" / "checkpoints" / "step_000001")])(_damaged_latest)


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])


def _swap_model(w: World, ck: Path) -> None:
    shutil.rmtree(ck / "model")
    shutil.copytree(w.other_model, ck / "model")


# ---------------------------------------------------------------- run directories


case("run_dir_under_file", lambda w: [str(w.tmp / "afile"), "run_dir"])(
    lambda w: ["train", *w.base(w.file("afile", "x") / "run")])
case("run_dir_is_file", lambda w: [str(w.tmp / "runfile"), "run_dir"], keep=lambda w: [w.tmp / "runfile"])(
    lambda w: ["train", *w.base(w.file("runfile", "my notes"))])
case("run_dir_metrics_is_directory", lambda w: [str(w.tmp / "mrun" / "metrics.jsonl"), "directory"])(
    lambda w: ["train", *w.base((w.tmp / "mrun" / "metrics.jsonl").mkdir(parents=True) or w.tmp / "mrun")])
case("eval_run_dir_under_file", lambda w: [str(w.tmp / "efile"), "run_dir"])(
    lambda w: ["eval", *w.base(w.file("efile", "x") / "run")])


# ---------------------------------------------------------------- export


def _export_case(id: str, expect: Callable[[World], list[str]], target: Callable[[World], Path],
                 keep: Callable[[World], list[Path]] | None = None, *, src: Callable[[World], Path] | None = None,
                 force: bool = False, cwd: bool = False) -> None:
    def build(w: World) -> list[str]:
        return ["export", str((src or (lambda w: w.ckpt))(w)), str(target(w)), *(["--force"] if force else [])]
    case(id, expect, keep=keep or (lambda w: [w.run]))(build)


def _notes(w: World) -> Path:
    d = w.tmp / "notes"
    d.mkdir(exist_ok=True)
    (d / "todo.txt").write_text("my notes")
    return d


_export_case("export_missing_checkpoint", lambda w: [str(w.tmp / "nock"), "checkpoint"], lambda w: w.tmp / "out",
             src=lambda w: w.tmp / "nock")
_export_case("export_not_checkpoint", lambda w: [str(w.tmp / "plain"), "checkpoint"], lambda w: w.tmp / "out",
             src=lambda w: (w.tmp / "plain").mkdir() or w.tmp / "plain")
_export_case("export_nonempty_target", lambda w: [str(w.tmp / "notes"), "--force"], _notes,
             keep=lambda w: [w.run, w.tmp / "notes"])
_export_case("export_into_own_run", lambda w: [str(w.run), "--force"], lambda w: w.run)
_export_case("export_into_own_run_forced", lambda w: [str(w.run), "checkpoint"], lambda w: w.run, force=True)
_export_case("export_into_checkpoint_forced", lambda w: [str(w.ckpt)], lambda w: w.ckpt, force=True)
_export_case("export_target_is_file", lambda w: [str(w.tmp / "f.txt")], lambda w: w.file("f.txt", "keep me"),
             keep=lambda w: [w.run, w.tmp / "f.txt"])
_export_case("export_target_under_file", lambda w: [str(w.tmp / "g.txt")], lambda w: w.file("g.txt", "keep") / "out",
             keep=lambda w: [w.run, w.tmp / "g.txt"])
_export_case("export_into_cwd_forced", lambda w: ["current directory"], lambda w: Path("."), force=True,
             keep=lambda w: [w.run, w.tmp / "cwdfile"])


# ---------------------------------------------------------------- the harness


world_base, test_bad_input_gives_one_line = catalog_tests(CASES, "bad-inputs")


def test_catalog_size():
    assert len(CASES) >= 80, len(CASES)
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"], [], ["train", "--help"], ["eval", "-h"],
                                  ["export", "--help"], ["sft", "--help"], ["config", "--help"]])
def test_help_prints_usage(args, capsys):
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "upslope" in out and "usage" in out.lower() and err == ""


SUBPROCESS = ["recipe_is_directory", "template_file_missing", "data_fake_parquet", "model_only_config",
              "reward_syntax_error", "export_into_own_run_forced"]
SLOW_SUBPROCESS = {"template_file_missing", "data_fake_parquet", "reward_syntax_error"}  # 9-11 s each
DEFAULT_SUBPROCESS = {"recipe_is_directory"}  # the others run in CI's slow set


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_SUBPROCESS else
                                  n if n in DEFAULT_SUBPROCESS else pytest.param(n, marks=IN_CI_SLOW_SET)
                                  for n in SUBPROCESS])
def test_real_cli_subprocess_same(name: str, world_base: World, tmp_path):
    """The installed command behaves as the in-process entry: exit 2, one line, no traceback."""
    c = next(x for x in CASES if x.id == name)
    w = World(world_base.tiny, world_base.run, world_base.ckpt, world_base.other_model, tmp_path)
    argv = c.build(w)
    kept = snapshot(c.keep(w))
    env = {**os.environ, "PYTHONPATH": str(REPO), "UPSLOPE_DEBUG": "0"}
    p = subprocess.run([sys.executable, "-m", "upslope.cli", *argv], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("upslope: error: "), p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    for s in c.expect(w):
        assert s in lines[0]
    assert snapshot(c.keep(w)) == kept


def test_debug_env_shows_traceback(world_base, monkeypatch):
    """UPSLOPE_DEBUG=1 re-raises, for developers."""
    from upslope.errors import UpslopeError

    monkeypatch.setenv("UPSLOPE_DEBUG", "1")
    with pytest.raises(UpslopeError):
        main(["train", "/no/such/recipe.yaml"])



def test_the_did_you_mean_hint():
    """The closest choice to a mistyped name, in the two forms the error lines use, or nothing when none is close."""
    from upslope.errors import did_you_mean

    assert did_you_mean("leanring_rate", ["learning_rate", "steps"]) == " (did you mean 'learning_rate'?)"
    assert did_you_mean("acuracy", {"accuracy": 1}, shown=lambda m: f"eval/{m}", paren=False) == \
        "; did you mean 'eval/accuracy'?"
    assert did_you_mean("zzz", ["learning_rate", "steps"]) == ""
