"""docs/agents.md's environment example, exactly as printed: its file is written to a temporary
directory and its command trains 2 steps on the tiny model through the command-line entry point;
then the environment and its tool are driven turn by turn, as the rollout drives them."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from run_helpers import metrics

from upslope.agents import ToolBox
from upslope.agents.formats import Hermes
from upslope.cli import main
from upslope.data.types import Example
from upslope.registry import ENVIRONMENTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def doc_example() -> tuple[str, str, list[str]]:
    """(file name, file text, arguments after `upslope train`) of the 'Writing an environment' section."""
    text = DOC.read_text()
    section = text[text.index("## Writing an environment with a tool"):]
    code = re.search(r"```python\n(# (\S+\.py)\n.*?)```", section, re.S)
    command = re.search(r"```bash\nupslope train (.*?)\n```", section, re.S)
    assert code and command, "docs/agents.md lost its example file or its command"
    return code.group(2), code.group(1), shlex.split(command.group(1))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_path):
    """The example's command, 2 steps on the tiny model: the run directory."""
    name, code, args = doc_example()
    folder = tmp_path_factory.mktemp("agents-doc")
    (folder / name).write_text(code)
    run = folder / "run"
    cwd = Path.cwd()
    os.chdir(folder)  # the command names the plugin file relative to the working directory
    try:
        status = main(["train", *args, f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}",
                       "train.steps=2", "train.eval_before=false", "train.eval_after=false",
                       "rollout.prompts_per_step=2", "rollout.n=2", "agent.max_turn_tokens=8", "log.progress=false",
                       "log.plot=false", "log.tensorboard=false"])
    finally:
        os.chdir(cwd)
    assert status == 0
    return run


def test_the_docs_example_trains(trained):
    name, code, args = doc_example()
    assert len(code.splitlines()) <= 45 and f"plugins=[{name}]" in args
    rows = metrics(trained)
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["agent/turns"] >= 1 and "reward/env/correct" in r for r in steps)


def test_the_docs_environment_and_tool_work_turn_by_turn(trained):
    """Its tool's schema and results, a tool turn, then a right and a wrong final answer."""
    env = ENVIRONMENTS.bind("letters", {"letter": "s"})()
    env.toolbox = ToolBox(env.tools, Hermes())
    [msg] = env.reset(Example(prompt="", id="arith-train-3"))
    assert msg["content"] == f"How many times does 's' occur in '{env.word}'?"
    schema = env.toolbox.schemas()[0]["function"]
    assert schema["name"] == "count_letter" and schema["parameters"]["required"] == ["word", "letter"]
    call = f'<tool_call>{{"name": "count_letter", "arguments": {{"word": "{env.word}", "letter": "s"}}}}</tool_call>'
    res = env.step([], call)
    count = env.word.count("s")
    assert not res.done and res.messages == [{"role": "tool", "name": "count_letter", "content": str(count)}]
    assert env.step([], f"It occurs {count} times").reward_parts == {"correct": 1.0}
    assert env.step([], f"It occurs {count + 1} times").reward_parts == {"correct": 0.0}
