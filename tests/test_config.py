"""The config tree: YAML recipes, `base:` inheritance, dotted overrides, and the errors a
user sees (key named, closest key suggested, line numbers), through the API and the CLI."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from upslope.cli import main
from upslope.config import Config, describe_options, dump, load_config
from upslope.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write(path, text: str):
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_defaults_without_recipe():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.train.steps == 40 and cfg.rollout.n == 8 and cfg.rollout.max_new_tokens == 8 and cfg.eval.k == [1]
    assert cfg.algo.advantage.name == "grpo" and cfg.reward == []


def test_yaml_recipe_and_typed_overrides(tmp_path):
    recipe = write(tmp_path / "r.yaml", """
        run_dir: runs/x
        train:
          steps: 5
        rollout:
          temperature: 0.7
        reward:
          - name: integer
            options: {extract: last}
    """)
    cfg = load_config(recipe, ["train.steps=12", "eval.k=[1, 4]", "eval.n=4", "rollout.top_p=0.5",
                               "model.use_chat_template=false", "data.options.ops=+-"])
    assert cfg.run_dir == "runs/x"
    assert cfg.train.steps == 12 and isinstance(cfg.train.steps, int)  # override wins over the recipe
    assert cfg.eval.k == [1, 4] and cfg.eval.n == 4
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.top_p == 0.5
    assert cfg.model.use_chat_template is False
    assert cfg.data.options == {"ops": "+-"}
    assert cfg.reward[0].name == "integer" and cfg.reward[0].options == {"extract": "last"}
    assert cfg.reward[0].weight == 1.0


def test_override_builds_nested_sections_and_lists_of_plugins():
    cfg = load_config(None, ["reward=[{name: integer, weight: 2}, {name: format}]", "eval.data.task=gsm8k"])
    assert [(r.name, r.weight) for r in cfg.reward] == [("integer", 2.0), ("format", 1.0)]
    assert cfg.eval.data is not None and cfg.eval.data.task == "gsm8k"


def test_base_recipe_inheritance(tmp_path):
    (tmp_path / "common").mkdir()
    write(tmp_path / "common" / "base.yaml", """
        train: {steps: 3, seed: 9}
        rollout: {n: 2, temperature: 0.5}
        algo:
          advantage: {name: grpo, options: {scale_by_std: false, eps: 0.001}}
    """)
    write(tmp_path / "child.yaml", """
        base: common/base.yaml
        train: {steps: 7}
        algo:
          advantage: {name: grpo, options: {eps: 0.01}}
    """)
    cfg = load_config(tmp_path / "child.yaml", ["rollout.n=6"])
    assert cfg.train.steps == 7  # child overrides the base
    assert cfg.train.seed == 9  # sibling key inherited from the base
    assert cfg.rollout.temperature == 0.5
    assert cfg.rollout.n == 6  # the command line overrides both
    # plugin options are replaced as a whole, not merged key by key
    assert cfg.algo.advantage.options == {"eps": 0.01}


def test_a_child_recipe_with_another_data_source_drops_the_bases_task_options(tmp_path):
    write(tmp_path / "base.yaml", """
        data: {task: arith, options: {ops: "*", digits: 1}, system_prompt: be brief}
    """)
    write(tmp_path / "task.yaml", "base: base.yaml\ndata: {task: gsm8k, split: train}\n")
    write(tmp_path / "file.yaml", "base: base.yaml\ndata: {path: train.jsonl}\n")
    write(tmp_path / "same.yaml", "base: base.yaml\ndata: {task: arith, split: test}\n")
    other = load_config(tmp_path / "task.yaml").data
    assert (other.task, other.split, other.options, other.system_prompt) == ("gsm8k", "train", {}, None)
    assert load_config(tmp_path / "file.yaml").data.options == {}
    same = load_config(tmp_path / "same.yaml").data  # the same task: merged key by key as before
    assert (same.split, same.options, same.system_prompt) == ("test", {"ops": "*", "digits": 1}, "be brief")
    assert load_config(Path(__file__).resolve().parents[1] / "recipes" / "gsm8k.yaml").data.options == {}


def test_a_recipes_py_files_are_relative_to_the_recipe(tmp_path, monkeypatch):
    """A .py file a recipe names beside it (an agent program, a reward function) is found from any working
    directory, in the recipe and in its base; a file only the working directory holds, and values that merely
    end in .py elsewhere, are left alone; the command line stays relative to the working directory."""
    (tmp_path / "recipes" / "progs").mkdir(parents=True)
    (tmp_path / "recipes" / "progs" / "agent.py").write_text("def agent(base_url, row):\n    return 1.0\n")
    (tmp_path / "recipes" / "rewards.py").write_text("def fn(c, a, m):\n    return 0.0\n")
    write(tmp_path / "recipes" / "base.yaml", """
        reward: [{name: "rewards.py:fn"}]
    """)
    write(tmp_path / "recipes" / "child.yaml", """
        base: base.yaml
        rollout: {kind: openai_agent, options: {agent: "progs/agent.py:agent", command: "python nowhere.py"}}
    """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(tmp_path / "recipes" / "child.yaml", [])
    assert cfg.rollout.options["agent"] == f"{tmp_path}/recipes/progs/agent.py:agent"
    assert cfg.reward[0].name == f"{tmp_path}/recipes/rewards.py:fn"
    assert cfg.rollout.options["command"] == "python nowhere.py"
    cli = load_config(tmp_path / "recipes" / "child.yaml", ["rollout.options={agent: progs/agent.py:agent}"])
    assert cli.rollout.options == {"agent": "progs/agent.py:agent"}


def test_base_chain_that_loops_is_an_error(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\ntrain: {steps: 1}\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(tmp_path / "a.yaml")


@pytest.mark.parametrize("override, bad_key, suggestion", [
    ("train.stepz=3", "train.stepz", "train.steps"),
    ("trian.steps=3", "trian", "train"),  # the first unknown section is reported
    ("eval.data.promt_field=q", "eval.data.promt_field", "eval.data.prompt_field"),
    ("reward=[{name: integer, wieght: 2}]", "reward[0].wieght", "reward[0].weight"),
])
def test_unknown_key_names_dotted_key_and_suggests_closest(override, bad_key, suggestion):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert f"unknown key '{bad_key}'" in msg
    assert f"did you mean '{suggestion}'?" in msg


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["optim.zzzzzz=1"])
    msg = str(info.value)
    assert "unknown key 'optim.zzzzzz'" in msg and "did you mean" not in msg
    assert "valid here: lr, weight_decay" in msg


@pytest.mark.parametrize("override, key, expected", [
    ("train.steps=abc", "train.steps", "valid integer"),
    ("rollout.temperature=hot", "rollout.temperature", "valid number"),
    ("engine.name=tpu", "engine.name", "unknown engine 'tpu'; known: auto, "),
    ("eval.k=4", "eval.k", "valid list"),
    ("eval.limit=0", "eval.limit", "greater than or equal to 1"),
])
def test_wrong_type_names_key_and_expected_type(override, key, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert msg.startswith(f"config: {key}:")
    assert expected in msg
    assert repr(yaml.safe_load(override.split("=", 1)[1])) in msg  # shows what was given


def test_wrong_type_in_recipe_names_the_file(tmp_path):
    recipe = write(tmp_path / "r.yaml", "train:\n  steps: many\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: train\.steps: .*valid integer"):
        load_config(recipe)


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["train.steps"])


def test_missing_recipe_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: recipe file not found"):
        load_config(tmp_path / "nope.yaml")


def test_missing_base_file(tmp_path):
    write(tmp_path / "child.yaml", "base: gone.yaml\n")
    with pytest.raises(ConfigError, match="gone.yaml: recipe file not found"):
        load_config(tmp_path / "child.yaml")


def test_invalid_yaml_reports_line_number(tmp_path):
    recipe = write(tmp_path / "bad.yaml", """
        train:
          steps: 5
          seed: a: b
        model:
          name: x
    """)
    with pytest.raises(ConfigError) as info:
        load_config(recipe)
    assert f"{recipe}:3: invalid YAML" in str(info.value)


def test_top_level_must_be_a_mapping(tmp_path):
    recipe = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(recipe)


def test_dump_round_trips():
    cfg = load_config(None, ["train.steps=11", "eval.k=[1,8]", "eval.n=8", "reward=[{name: math}]"])
    again = Config.model_validate(yaml.safe_load(dump(cfg)))
    assert again == cfg


def test_describe_options_covers_dotted_keys_with_help():
    rows = {key: (default, help_text) for key, default, help_text in describe_options()}
    assert rows["train.steps"][0] == "40"
    assert rows["model.name"][0] == "smollm2-135m-instruct"
    assert "advantage estimator" in rows["algo.advantage"][1]
    assert all(help_text for _, help_text in rows.values())


# ------------------------------------------------------------------ CLI


def test_cli_config_show_prints_resolved_yaml(capsys, tmp_path):
    recipe = write(tmp_path / "r.yaml", "train: {steps: 5}\n")
    assert main(["config", "show", str(recipe), "train.seed=3", "eval.k=[1,2]", "eval.n=2"]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert shown["train"]["steps"] == 5 and shown["train"]["seed"] == 3
    assert shown["eval"]["k"] == [1, 2]
    assert Config.model_validate(shown) == load_config(recipe, ["train.seed=3", "eval.k=[1,2]", "eval.n=2"])


def test_cli_config_options_lists_every_option(capsys):
    assert main(["config", "options"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(describe_options())
    assert any(line.startswith("train.steps = 40    # ") for line in lines)


def test_cli_help(capsys):
    assert main(["--help"]) == 0
    assert "upslope COMMAND" in capsys.readouterr().out


@pytest.mark.parametrize("argv, expected", [
    (["config", "show", "train.stepz=3"], "did you mean 'train.steps'?"),
    (["config", "show", "train.steps=abc"], "train.steps: Input should be a valid integer"),
    (["config", "show", "/nonexistent/recipe.yaml"], "recipe file not found"),
    (["config", "show", "a.yaml", "b.yaml"], "unexpected argument 'b.yaml'"),
    (["config", "frobnicate"], "usage: upslope config show"),
    (["fly"], "unknown command 'fly'"),
    (["eval", "model.name=/nonexistent/model", "engine.name=hf"], "not a model directory"),
])
def test_cli_bad_input_is_one_error_line_exit_2(capsys, monkeypatch, argv, expected):
    monkeypatch.delenv("UPSLOPE_DEBUG", raising=False)
    assert main(argv) == 2
    captured = capsys.readouterr()
    err_lines = captured.err.strip().splitlines()
    assert len(err_lines) == 1, captured.err
    assert err_lines[0].startswith("upslope: error: ")
    assert expected in err_lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_cli_debug_env_reraises(monkeypatch):
    monkeypatch.setenv("UPSLOPE_DEBUG", "1")
    with pytest.raises(ConfigError):
        main(["config", "show", "train.stepz=3"])


def test_a_path_alone_then_its_options_combine():
    """eval.data=PATH is eval.data.path; a later eval.data.<option> override adds to it, in either order."""
    from upslope.config import load_config

    for overrides in (["eval.data=/tmp/held.jsonl", "eval.data.prompt_field=question"],
                      ["eval.data.prompt_field=question", "eval.data.path=/tmp/held.jsonl"]):
        data = load_config(None, overrides).eval.data
        assert (data.path, data.prompt_field) == ("/tmp/held.jsonl", "question")
