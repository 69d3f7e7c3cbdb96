"""Importing a script of benchmarks/ in a test (imported by module name: tests/ is on sys.path).

The scripts are not a package; `load` imports one under its own name, once per test session, so several
test files share one module (and its `sys.modules` entry, which dataclasses and sibling imports look up)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py as module `name`, imported on the first call."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
