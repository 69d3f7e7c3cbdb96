"""benchmarks/plugin_size.py: the line counts against a hand-counted module, and the committed page."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[2]
ps = load("plugin_size")

MODULE = '''"""A module."""


def helper_b(x):
    """Docstring line one.

    Line three of the docstring.
    """
    # a comment
    return x + 1


def helper_a(x):
    return helper_b(x) * 2


def other_plugin(x):
    return x


TABLE = {"b": helper_b}


def plugin(x):
    """The plugin."""

    y = helper_a(x)
    return other_plugin(y) + TABLE["b"](y)


def unrelated(x):
    return x
'''


def _module(tmp_path: Path):
    path = tmp_path / "hand_counted_module.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("hand_counted_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_closure_follows_helpers_and_tables_but_not_other_plugins(tmp_path):
    module = _module(tmp_path)
    registered = {id(module.plugin), id(module.other_plugin)}
    got = ps.closure(module, ["plugin"], registered, own={id(module.plugin)})
    assert got == {"plugin", "helper_a", "helper_b", "TABLE"}


def test_lines_leave_out_blanks_comments_and_docstrings():
    source = MODULE.splitlines()
    defs = ps._defs(ast.parse(MODULE))
    assert ps._lines(defs["helper_b"], source) == (2, 5)  # def + return; with its 3 non-blank docstring lines
    assert ps._lines(defs["plugin"], source) == (3, 4)
    assert ps._lines(defs["TABLE"], source) == (1, 1)


def test_a_method_is_found_by_what_its_recipe_adds_to_its_baseline():
    assert ps.method_plugins("cero") == [("sampler", "cero")]
    assert ps.method_plugins("arena") == [("reward", "arena")]  # the task's verifier it also names is reused
    assert ps.method_plugins("catpo") == [("rollout", "tree"), ("advantage", "tree")]
    assert ps.method_plugins("dcmdp") == [("loss_term", "dcmdp")]  # a loss term in algo.terms
    size = ps.size_of("mipu")  # an update check in algo.accept
    assert size.code > 0 and "accept `mipu`" in " ".join(size.parts)


def test_every_method_has_code_and_the_committed_page_is_current():
    page = ps.page()
    assert "(none found)" not in page and "not explained yet" not in page
    assert (ROOT / "docs" / "plugin_sizes.md").read_text() == page, "run: python benchmarks/plugin_size.py --write"
