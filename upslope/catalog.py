"""What is registered and configurable, as text (`upslope plugins [KIND]`) and as the generated
docs tables (docs/plugins.md from the registries, docs/options.md from the config tree).

Regenerate the docs after changing a plugin or an option: `python -m upslope.catalog`
(tests/test_docs_tables.py fails while the committed tables differ from its output).
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

from upslope.registry import REGISTRIES, Entry, load_builtins

DOCS = {"plugins.md": "plugins_markdown", "options.md": "options_markdown"}
REGENERATE = "PYTHONPATH=. python -m upslope.catalog"


@dataclass(frozen=True)
class OptionInfo:
    """One option of a plugin: a keyword-only parameter of its function."""

    name: str
    type: str
    default: str
    help: str


def options_of(entry: Entry[Any]) -> list[OptionInfo]:
    """The plugin's options with their types, defaults and help (docstring `name: help` lines)."""
    helps = entry.option_help()
    out = []
    for name, p in entry.options().items():
        ann = p.annotation
        kind = "any" if ann is inspect.Parameter.empty else ann if isinstance(ann, str) else type_name(ann)
        default = "required" if p.default is inspect.Parameter.empty else repr(_portable(p.default))
        out.append(OptionInfo(name, kind, default, helps.get(name, "")))
    return out


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def type_name(ann: Any) -> str:
    """A short readable type: `float (>0)` for pydantic-constrained Annotated types, no `typing.` prefixes."""
    if get_origin(ann) is Annotated:
        base, *meta = get_args(ann)
        marks = [f"{_BOUNDS[b]}{getattr(m, b)}" for info in meta for m in getattr(info, "metadata", [info])
                 for b in _BOUNDS if getattr(m, b, None) is not None]
        return type_name(base) + (f" ({', '.join(marks)})" if marks else "")
    return inspect.formatannotation(ann).replace("typing.", "")


def _portable(value: Any) -> Any:
    """A default that is a path inside the checkout's parent (e.g. ../shared/data) shown relative to the
    checkout, and one inside $UPSLOPE_DATA_DIR as the same file of ../shared/data, so the generated
    docs are the same in every clone and wherever the data sets are."""
    from upslope.data.paths import shared_data_dir

    root = Path(__file__).resolve().parents[1]
    data = str(shared_data_dir())
    if isinstance(value, str) and value.startswith(data + os.sep):
        return os.path.join("..", "shared", "data", os.path.relpath(value, data))
    if isinstance(value, str) and value.startswith(str(root.parent) + os.sep):
        return os.path.relpath(value, root)
    return value


def traits_of(entry: Entry[Any]) -> str:
    """The registry flags the loop reads (e.g. zero_at_zero_advantage=True), as `k=v` text."""
    shown = {k: getattr(v, "__name__", v) if callable(v) else v for k, v in entry.shown_traits().items()}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))


def kinds(kind: str | None = None) -> list[str]:
    """Registry kinds, all or the one asked for (an unknown kind is a one-line error)."""
    load_builtins()
    if kind is None:
        return sorted(REGISTRIES)
    if kind not in REGISTRIES:
        from upslope.errors import ConfigError

        raise ConfigError(f"upslope plugins: unknown kind '{kind}'; known: {', '.join(sorted(REGISTRIES))}")
    return [kind]


def builtin_kinds() -> list[str]:
    """The kinds upslope itself defines (registries created elsewhere, e.g. by a user, excluded)."""
    from upslope import registry

    load_builtins()
    return sorted(r.kind for r in vars(registry).values() if isinstance(r, registry.Registry))


def plugins_text(kind: str | None = None) -> str:
    """The `upslope plugins [KIND]` listing: every plugin, its help, traits and options."""
    lines = []
    for k in kinds(kind):
        entries = REGISTRIES[k].entries()
        lines.append(f"{k} ({len(entries)})")
        for e in entries:
            user = "" if e.module.startswith("upslope.") else f" [{e.module}]"
            lines.append(f"  {e.name}: {e.summary() or '(no docstring)'}{user}")
            if e.shown_traits():
                lines.append(f"      traits: {traits_of(e)}")
            for o in options_of(e):
                lines.append(f"      {o.name}: {o.type} = {o.default}" + (f"  # {o.help}" if o.help else ""))
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def plugins_markdown() -> str:
    """docs/plugins.md: one table per registry kind, built-in plugins only (user plugins vary)."""
    out = ["# Plugins", "", f"Generated from the registries by `{REGENERATE}`; do not edit by hand.",
           "`upslope plugins [KIND]` prints the same, user plugins (`plugins=[...]`) included.",
           "An option's help comes from a `name: help` line in the plugin's docstring.", ""]
    for k in builtin_kinds():
        entries = [e for e in REGISTRIES[k].entries() if e.module.startswith("upslope.")]
        out += [f"## {k}", ""]
        if not entries:
            out += ["(no built-in plugin yet)", ""]
            continue
        out += ["| name | what | options (type = default) | traits |", "|---|---|---|---|"]
        for e in entries:
            opts = "<br>".join(f"`{o.name}`: {o.type} = {o.default}" + (f" ({o.help})" if o.help else "")
                               for o in options_of(e)) or "-"
            out.append(f"| `{e.name}` | {_cell(e.summary())} | {_cell(opts)} | {_cell(traits_of(e)) or '-'} |")
        out.append("")
    return "\n".join(out)


def options_markdown() -> str:
    """docs/options.md: every config option with its default and help, from the config tree."""
    from upslope.config import describe_options

    out = ["# Options", "", f"Generated from the config tree by `{REGENERATE}`; do not edit by hand.",
           "Set them in a recipe or as `key=value` overrides; `upslope config options` prints the same.", "",
           "| key | default | help |", "|---|---|---|"]
    for key, default, help_text in describe_options():
        out.append(f"| `{key}` | `{_cell(str(default))}` | {_cell(help_text)} |")
    from upslope.sweep.spec import Range, SweepSpec

    out += ["", "## upslope sweep", "",
            "The keys of a sweep file, and the flags of `upslope sweep` (`--key VALUE`, `_` written `-`; "
            "`upslope sweep --help`). A range in `space` is one of:", ""]
    out += [f"- `{key}`: {help_text}" for key, _, help_text in describe_options(Range)]
    out += ["", "| key | default | help |", "|---|---|---|"]
    for key, default, help_text in describe_options(SweepSpec):
        out.append(f"| `{key}` | `{_cell(str(default))}` | {_cell(help_text)} |")
    return "\n".join(out) + "\n"


def generated_docs() -> dict[str, str]:
    """File name under docs/ -> its generated text."""
    return {name: globals()[fn]() for name, fn in DOCS.items()}


def main(argv: list[str] | None = None) -> int:
    """Write the generated tables into docs/ (of the current directory, or the one given)."""
    args = sys.argv[1:] if argv is None else argv
    docs = Path(args[0] if args else "docs")
    for name, text in generated_docs().items():
        (docs / name).write_text(text)
        print(f"wrote {docs / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
