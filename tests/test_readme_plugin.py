"""The README's plugin example, exactly as printed there: its file is written to a temporary
directory and its command line runs a real short training (tiny model, HF engine, 2 steps)
through the command-line entry point; the user's loss must have been called every step. Its
recipe form must give the same config."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from run_helpers import metrics

from upslope.cli import main
from upslope.config import load_config

README = Path(__file__).resolve().parents[1] / "README.md"


def plugins_section() -> str:
    text = README.read_text()
    start = text.index("## Plugins in five minutes")
    return text[start:text.index("\n## ", start + 1)]


def readme_example() -> tuple[str, str, list[str]]:
    """(file name, file text, command-line arguments after `upslope train`) of the Plugins section."""
    code = re.search(r"```python\n(# (\S+\.py)\n.*?)```", plugins_section(), re.S)
    command = re.search(r"```bash\nupslope train (.*?)\n```", plugins_section(), re.S)
    assert code and command, "README's Plugins section lost its example file or its command"
    return code.group(2), code.group(1), shlex.split(command.group(1))


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory) -> Path:
    """The README's plugin file, written once (a process imports one file per plugin name)."""
    folder = tmp_path_factory.mktemp("readme-example")
    name, code, _ = readme_example()
    (folder / name).write_text(code)
    return folder


def test_the_readme_plugin_example_trains(example_dir, tmp_path, monkeypatch, tiny_model_path, capsys):
    name, code, args = readme_example()
    assert len(code.splitlines()) <= 20 and f"plugins=[{name}]" in args
    monkeypatch.chdir(example_dir)
    run = tmp_path / "run"
    status = main(["train", *args, f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}",
                   "train.steps=2", "train.eval_before=false", "train.eval_after=false", "rollout.prompts_per_step=2",
                   "rollout.n=2", "log.progress=false", "log.plot=false", "log.tensorboard=false"])
    assert status == 0, capsys.readouterr().err
    records = metrics(run)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    metric = [k for k in re.findall(r'"([\w/]+)": ', code) if "/" in k]
    assert metric, "the README's loss should return a named metric"
    for r in steps:  # the metric exists only if the user's loss ran in that step's update
        assert 0.0 <= r[metric[0]] <= 1.0, r
    saved = yaml.safe_load((run / "checkpoints" / "step_000002" / "config.yaml").read_text())
    assert saved["algo"]["policy_loss"]["name"] in code and saved["plugins"] == [str(example_dir.resolve() / name)]


def test_the_readme_recipe_is_the_same_as_its_command_line(example_dir, monkeypatch):
    _, _, args = readme_example()
    recipe = re.search(r"```yaml\n# (\S+\.yaml)\n(.*?)```", plugins_section(), re.S)
    assert recipe, "README's Plugins section lost its recipe"
    (example_dir / recipe.group(1)).write_text(recipe.group(2))
    from_recipe = load_config(example_dir / recipe.group(1))
    monkeypatch.chdir(example_dir)
    assert from_recipe == load_config(None, args)
