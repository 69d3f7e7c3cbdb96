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


def _upslope_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every `from upslope... import name` in a file, the ones inside
    functions included (benchmarks and the CLI import lazily, so importing the file checks nothing)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "upslope":
            out += [(node.lineno, node.module, alias.name) for alias in node.names if alias.name != "*"]
    return out


def _unresolved_imports(path: Path) -> list[str]:
    """The upslope names a file imports that do not exist where it imports them from."""
    import importlib

    missing = []
    for line, module, name in _upslope_imports(path):
        try:
            target = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing.append(f"{path.name}:{line}: module {module} ({exc})")
            continue
        if not hasattr(target, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    return missing


@pytest.mark.parametrize("folder", CHECKED)
def test_every_upslope_import_resolves(folder):
    """Each imported upslope name exists where it is imported from (a module moved or a
    function renamed breaks a lazy import only when that code path runs)."""
    missing = [m for path in _python_files() if path.relative_to(ROOT).parts[0] == folder
               for m in _unresolved_imports(path)]
    assert missing == [], "\n".join(missing)


def test_the_check_finds_a_lazy_import_of_a_moved_name(tmp_path):
    bench = tmp_path / "bench.py"
    bench.write_text("def worker():\n    from upslope.train.loop import Trainer\n    from upslope.config import Config\n"
                     "    from upslope.nowhere import thing\n    return Trainer, Config, thing\n")
    assert _unresolved_imports(bench) == ["bench.py:2: upslope.train.loop has no Trainer",
                                          "bench.py:4: module upslope.nowhere (No module named 'upslope.nowhere')"]
