"""The package's import graph, read from the source (every `import` / `from` of every module,
function-level ones included, `if TYPE_CHECKING:` blocks excluded): no cycles, and nothing the
registries import by name reaches upslope.config while loading (config consults the registries).
"""
from __future__ import annotations

import ast
from pathlib import Path

import upslope
from upslope.registry import BUILTIN_MODULES

ROOT = Path(upslope.__file__).parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__)."""
    out = {}
    for f in root.rglob("*.py"):
        parts = f.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


class _Imports(ast.NodeVisitor):
    """Collects the modules a file imports; `load_time` skips function bodies (run later, not on import)."""

    def __init__(self, name: str, is_package: bool, load_time: bool):
        self.package = name.split(".") if is_package else name.split(".")[:-1]
        self.load_time = load_time
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):  # annotations only: never executed
            for stmt in node.orelse:
                self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if not self.load_time:
            self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package[: len(self.package) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        self.found.add(base)
        self.found.update(f"{base}.{a.name}" for a in node.names)


def import_graph(load_time: bool = False, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a name resolves to its longest module prefix).
    With `load_time`, only imports that run when the module is imported, plus its parent
    packages (importing a.b.c runs a/__init__ and a/b/__init__ first)."""
    files = module_files(root)
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        visitor = _Imports(name, f.name == "__init__.py", load_time)
        visitor.visit(ast.parse(f.read_text()))
        found = set(visitor.found)
        if load_time:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(2, len(parts)))
        targets = set()
        for m in found:
            while m and m not in files:
                m = m.rpartition(".")[0]
            if m and m != name and m != root.name:
                targets.add(m)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def reachable(graph: dict[str, set[str]], starts: list[str]) -> dict[str, str]:
    """Every module reachable from `starts` -> the module that first imported it (for the error message)."""
    via = {s: s for s in starts}
    todo = list(starts)
    while todo:
        v = todo.pop()
        for w in graph.get(v, ()):
            if w not in via:
                via[w] = v
                todo.append(w)
    return via


def test_the_graph_sees_a_known_import_and_a_planted_cycle(tmp_path):
    """The graph builder itself: relative imports resolve, TYPE_CHECKING is skipped, a cycle is found."""
    pkg = tmp_path / "pkgx"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkgx.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkgx import a\n")
    graph = import_graph(root=pkg)
    assert graph["pkgx.a"] == {"pkgx.sub", "pkgx.sub.b"} and graph["pkgx.sub.b"] == {"pkgx.a"} and graph["pkgx.c"] == set()
    assert cycles(graph) == [["pkgx.a", "pkgx.sub.b"]]
    assert cycles(import_graph(load_time=True, root=pkg)) == []  # b imports a only when f runs


def test_no_import_cycles():
    found = cycles(import_graph())
    assert "upslope.train.trainers.rl" in import_graph() and not found, \
        "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_plugin_modules_do_not_import_config_while_loading():
    """config -> registry -> (by name) the built-in plugin modules: none of those may import
    upslope.config when loaded, or config and the registries would load each other."""
    graph = import_graph(load_time=True)
    missing = [m for m in BUILTIN_MODULES if m not in graph]
    assert not missing, f"BUILTIN_MODULES names modules that do not exist: {missing}"
    via = reachable(graph, list(BUILTIN_MODULES))
    assert "upslope.config" not in via, f"{via['upslope.config']} imports upslope.config at load time " \
                                        f"(reached from the built-in plugin modules)"


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
