"""The test tree's own rules: pytest imports test modules by basename (no packages), so two files
with the same name in different folders break collection of the whole suite."""
from __future__ import annotations

from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_basenames_are_unique():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name not in ("conftest.py", "__init__.py"))
    assert not [n for n, c in names.items() if c > 1], sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                                                               if names[p.name] > 1)


def test_every_test_folder_is_collected(request):
    """No folder of tests is skipped by pytest's norecursedirs (its default skips any folder named
    `dist`, which once hid tests/dist, now tests/distributed, from every run)."""
    patterns = request.config.getini("norecursedirs")
    folders = {p.parent for p in TESTS.rglob("test_*.py")}
    hidden = [str(f.relative_to(TESTS)) for f in folders
              if any(fnmatch(part, pat) for part in f.relative_to(TESTS).parts for pat in patterns)]
    assert hidden == [], f"folders pytest will not enter: {hidden} (norecursedirs = {patterns})"
