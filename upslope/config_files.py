"""Recipe files and command-line overrides into one raw nested mapping (before validation): a recipe's YAML
with its `base` chain merged under it and the files it names made absolute against it, then `key=value`
overrides set by their dotted keys."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from upslope.errors import ConfigError, UpslopeError
from upslope.yaml_strict import load_yaml, parse_value


def read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe file as a mapping: its `base` chain merged under it, plugin and .py files made absolute."""
    from upslope.fsutil import read_text_file

    try:
        text = read_text_file(path, "recipe file")
    except UpslopeError as exc:
        raise ConfigError(str(exc)) from None
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of options at the top level")
    if isinstance(data.get("plugins"), list):  # plugin files are relative to the recipe naming them
        data["plugins"] = absolute_plugin_files(data["plugins"], path.parent)
    data = _recipe_relative_py_files(data, path.parent)
    base = data.pop("base", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be the path of a recipe file, got {base!r}")
    if base:
        base_path = (path.parent / base).resolve()
        if base_path in seen:
            raise ConfigError(f"{path}: 'base' chain loops back to {base_path}")
        data = merge(read_recipe(base_path, seen + (path.resolve(),)), data)
    return data


def absolute_plugin_files(entries: list[Any], base: Path) -> list[Any]:
    """`plugins` with each .py file made absolute against `base` (the saved config then works anywhere)."""
    from upslope.plugins import is_file_entry

    return [str((base / p).expanduser().resolve()) if isinstance(p, str) and is_file_entry(p) else p for p in entries]


def _recipe_relative_py_files(value: Any, base: Path) -> Any:
    """Every option value in a recipe that names a .py file beside it ('agent.py:agent', 'env.py', a reward's
    'rewards.py:fn'), made absolute when the file exists relative to the recipe, so the recipe runs from any
    directory; other values (and files that exist only relative to the working directory) are left as they are."""
    if isinstance(value, dict):
        return {k: _recipe_relative_py_files(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_recipe_relative_py_files(v, base) for v in value]
    if not isinstance(value, str) or "://" in value:
        return value
    file, sep, name = value.partition(".py:") if ".py:" in value else (value[:-3], "", "") if value.endswith(".py") \
        else ("", "", "")
    if not file or Path(file).expanduser().is_absolute():
        return value
    found = (base / f"{file}.py").resolve()
    return f"{found}{':' + name if sep else ''}" if found.is_file() else value


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, recursively; a plugin given a different name, or a data section given another
    task or a file in place of a task, replaces the old one whole (its options belonged to the old one)."""
    if _other_plugin(base, top):
        return dict(top)
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "options" else v
    return out


def _other_plugin(base: dict[str, Any], top: dict[str, Any]) -> bool:
    """Does `top` name another plugin (or data source) than `base`?"""
    if any(k in top and k in base and top[k] != base[k] for k in ("name", "task")):
        return True
    return "path" in top and "task" in base and "task" not in top


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set the dotted key of `key=value` (the value read as YAML) in the nested mapping `raw`."""
    if "=" not in item:
        raise ConfigError(f"override '{item}': expected key=value, e.g. train.steps=10")
    key, _, text = item.partition("=")
    value = parse_value(text, f"override '{key}'")
    parts = key.strip().split(".")
    node = raw
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        shorthand = STRING_SHORTHANDS.get(".".join(parts[:i + 1]))
        if isinstance(nxt, str) and shorthand:  # eval.data=test.jsonl, then eval.data.prompt_field=...
            nxt = {shorthand: nxt}
            node[p] = nxt
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    node[parts[-1]] = value


# sections a plain string stands for, as the option that string sets (eval.data=test.jsonl is eval.data.path)
STRING_SHORTHANDS = {"eval.data": "path"}
