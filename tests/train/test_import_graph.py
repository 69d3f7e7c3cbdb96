"""No import cycle passes through the training package, evaluation, the logs or the Batch
(every `import` counts, function-level ones included; `if TYPE_CHECKING:` blocks do not)."""
from __future__ import annotations

import ast
from pathlib import Path

import upslope

ROOT = Path(upslope.__file__).resolve().parent
OWNED = ("upslope.train", "upslope.eval", "upslope.logs", "upslope.batch")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The upslope modules `path` imports (a `from X import y` counts X, and X.y when that is a module)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: imports(path, set(files)) - {name} for name, path in files.items()}


def cycle_through(g: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth-first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in g.get(node, ()):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_no_import_cycle_through_train_eval_logs_or_batch():
    g = graph()
    owned = [m for m in g if m.startswith(OWNED)]
    assert "upslope.train.trainers.rl" in owned and "upslope.train.learner.updater" in owned
    cycles = {m: c for m in owned if (c := cycle_through(g, m))}
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles.values())


def test_the_checker_finds_a_cycle():
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_through({"a": {"b"}, "b": set()}, "a") is None


def test_training_code_reports_through_the_sinks_only():
    """No module of upslope.train prints: messages go through logs.progress.Report, metrics
    through logs.sinks.MetricsLogger (so a run can be silenced or redirected in one place)."""
    offenders = []
    for path in (ROOT / "train").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "console" for a in node.names):
                offenders.append(f"{path.name}: imports console")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.name}:{node.lineno}: print()")
    assert not offenders, offenders
