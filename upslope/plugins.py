"""User plugin modules: `plugins: [my_pkg.module, path/to/file.py]` in a recipe (or
`plugins=[...]` on the command line) imports them before the config is checked, so the names
they register are valid in the same config. Each failure is one line: a module or file not
found, a syntax error (file:line), an exception while importing, a name registered twice.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from upslope.errors import ConfigError, UpslopeError
from upslope.registry import load_builtins

_LOADED: dict[str, ModuleType] = {}  # resolved file path or module name -> module (import each once)


def is_file_entry(entry: str) -> bool:
    """A `plugins` entry naming a .py file (else a dotted module name)."""
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def import_plugins(entries: Any) -> list[ModuleType]:
    """Import every user plugin module or file in `entries` (built-ins first, so a clash is
    reported against the user's module); returns the modules."""
    if isinstance(entries, str) or not isinstance(entries, (list, tuple)):
        raise ConfigError(f"plugins: expected a list of module names or .py files, e.g. "
                          f"plugins=[my_pkg.module,path/to/file.py] (got {entries!r})")
    load_builtins()
    modules = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(f"plugins[{i}]: expected a module name or a .py file path (got {entry!r})")
        modules.append(_import_file(Path(entry)) if is_file_entry(entry) else _import_module(entry))
    return modules


def _import_module(name: str) -> ModuleType:
    if name in _LOADED:
        return _LOADED[name]
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", name):
        raise ConfigError(f"plugins: '{name}' is neither a dotted module name nor a .py file path")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise ConfigError(f"plugins: module '{name}' not found (is it installed or on PYTHONPATH? "
                              f"a file needs a path ending in .py)") from None
        raise _import_failed(exc, name, None) from None
    except Exception as exc:
        raise _import_failed(exc, name, None) from None
    _LOADED[name] = module
    return module


def _import_file(path: Path) -> ModuleType:
    path = path.expanduser().resolve()
    key = str(path)
    if key in _LOADED:
        return _LOADED[key]
    if not path.is_file():
        raise ConfigError(f"plugins: file not found: {path}")
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    name = f"upslope_user_plugins.{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugins: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # visible while it runs (dataclasses, pickling look it up)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_failed(exc, str(path), path) from None
    _LOADED[key] = module
    return module


def _import_failed(exc: BaseException, what: str, path: Path | None) -> ConfigError:
    """One line for an exception raised while importing a plugin: where (file:line when known) and what."""
    if isinstance(exc, SyntaxError):
        return ConfigError(f"{exc.filename}:{exc.lineno}: syntax error in plugin module ({exc.msg})")
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if path is not None and Path(f.filename).resolve() == path] or \
          [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    where = f"{own[-1].filename}:{own[-1].lineno}" if own else what
    if isinstance(exc, UpslopeError):  # e.g. a name registered twice: already a clear line
        return ConfigError(f"{where}: plugin {what}: {exc}")
    text = str(exc).splitlines()[0] if str(exc) else ""
    return ConfigError(f"{where}: importing plugin {what} raised {type(exc).__name__}" + (f": {text}" if text else ""))
