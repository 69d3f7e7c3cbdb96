"""The generated docs tables (docs/plugins.md from the registries, docs/options.md from the
config tree) match what the generator writes now: a changed plugin or option that was not
regenerated fails here, with the command that regenerates them."""
from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from upslope.catalog import REGENERATE, generated_docs, main

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", sorted(generated_docs()))
def test_committed_table_matches_the_generator(name):
    expected = generated_docs()[name]
    path = DOCS / name
    committed = path.read_text() if path.exists() else ""
    diff = "".join(list(difflib.unified_diff(committed.splitlines(True), expected.splitlines(True),
                                             f"committed {name}", f"generated {name}"))[:40])
    assert committed == expected, f"docs/{name} is out of date; regenerate with `{REGENERATE}`\n{diff}"


def test_the_tables_hold_every_plugin_and_option():
    docs = generated_docs()
    plugins, options = docs["plugins.md"], docs["options.md"]
    for row in ("| `grpo` |", "| `ppo_clip` |", "| `uniform` |", "| `hf` |", "| `vllm` |", "| `k3` |"):
        assert row in plugins, row
    assert "zero_at_zero_advantage=True" in plugins and "`eps_high`: float (>=0) = 0.2" in plugins
    for key in ("`plugins`", "`engine.name`", "`data.sampler`", "`algo.advantage`", "`train.steps`"):
        assert f"| {key} |" in options, key


def test_the_generator_writes_both_files(tmp_path, capsys):
    assert main([str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == generated_docs()
    assert "wrote" in capsys.readouterr().out
