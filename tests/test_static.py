"""Static checks over every Python file of the package, the benchmarks and the tests: pyflakes
finds names used but never defined, and names imported or assigned but never used. Benchmarks
are run by hand, not by the test suite, so an undefined name there (the TRL side-by-side once
read a variable that only its other worker defined) surfaced only when someone ran one; this
catches the class at once."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pyflakes import messages
from pyflakes.checker import Checker

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("upslope", "benchmarks", "tests")


def _python_files() -> list[Path]:
    return sorted(p for folder in CHECKED for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _problems(path: Path) -> list[str]:
    """pyflakes' findings in one file, less those its line marks `# noqa` and the imports of a
    package's `__init__.py` (they register plugins or re-export)."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for m in Checker(ast.parse(source, filename=str(path)), filename=str(path)).messages:
        if "# noqa" in lines[m.lineno - 1]:
            continue
        if path.name == "__init__.py" and isinstance(m, messages.UnusedImport):
            continue
        found.append(f"{path.relative_to(ROOT)}:{m.lineno}: {m.message % m.message_args}")
    return found


def test_the_checked_folders_hold_python_files():
    counts = {folder: len(list((ROOT / folder).rglob("*.py"))) for folder in CHECKED}
    assert all(counts.values()), counts


@pytest.mark.parametrize("folder", CHECKED)
def test_no_undefined_or_unused_names(folder):
    problems = [p for path in _python_files() if path.relative_to(ROOT).parts[0] == folder for p in _problems(path)]
    assert problems == [], "\n".join(problems)


def test_the_check_finds_an_undefined_name(tmp_path):
    """The check itself: a worker reading a name only another function defines is reported."""
    bad = tmp_path / "bench.py"
    bad.write_text("def worker():\n    return reward_options\n\n\ndef other():\n    reward_options = 1\n"
                   "    return reward_options\n")
    tree = ast.parse(bad.read_text())
    found = [m for m in Checker(tree, filename=str(bad)).messages]
    assert [type(m) for m in found] == [messages.UndefinedName] and found[0].lineno == 2
