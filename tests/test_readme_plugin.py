"""The README's plugin example, exactly as printed there: its file is written to a temporary
directory and its command line runs a real short training (tiny model, HF engine, 2 steps)
through the command-line entry point; the user's loss must have been called every step."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from upslope.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> tuple[str, str, list[str]]:
    """(file name, file text, command-line arguments after `upslope train`) of the Plugins section."""
    text = README.read_text()
    section = text[text.index("### Plugins"):]
    code = re.search(r"```python\n(# (\S+\.py)\n.*?)```", section, re.S)
    command = re.search(r"```bash\nupslope train (.*?)\n```", section, re.S)
    assert code and command, "README's Plugins section lost its example file or its command"
    return code.group(2), code.group(1), shlex.split(command.group(1))


def test_the_readme_plugin_example_trains(tmp_path, monkeypatch, tiny_model_path, capsys):
    name, code, args = readme_example()
    assert len(code.splitlines()) <= 20 and f"plugins=[{name}]" in args
    (tmp_path / name).write_text(code)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    status = main(["train", *args, f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}",
                   "train.steps=2", "train.eval_before=false", "train.eval_after=false", "rollout.prompts_per_step=2",
                   "rollout.n=2", "log.progress=false", "log.plot=false", "log.tensorboard=false"])
    assert status == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    metric = [k for k in re.findall(r'"([\w/]+)": ', code) if "/" in k]
    assert metric, "the README's loss should return a named metric"
    for r in steps:  # the metric exists only if the user's loss ran in that step's update
        assert 0.0 <= r[metric[0]] <= 1.0, r
    saved = yaml.safe_load((run / "checkpoints" / "step_000002" / "config.yaml").read_text())
    assert saved["algo"]["policy_loss"]["name"] in code and saved["plugins"] == [str(tmp_path.resolve() / name)]
