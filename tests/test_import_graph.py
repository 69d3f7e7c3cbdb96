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


# The package's layers, lowest first: a module may import its own layer and the layers below it,
# never one above (function-local imports included). A module's layer is that of the longest
# prefix listed; every module must have one, so a new package has to be placed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("upslope.errors", "upslope.bounds", "upslope.cache", "upslope.yaml_strict", "upslope.fsutil",
              "upslope.config_base", "upslope.config_schema", "upslope.config_commands", "upslope.config_checks",
              "upslope.config_files", "upslope.registry", "upslope.plugins",
              "upslope.config", "upslope.batch", "upslope.seeding", "upslope.hardware", "upslope.models",
              "upslope.scalar_head", "upslope.routing", "upslope.logs", "upslope.engine")),
    ("plugins", ("upslope.data", "upslope.algos", "upslope.sandbox")),
    ("rewards", ("upslope.rewards",)),
    ("agents", ("upslope.agents",)),
    ("rollout", ("upslope.rollout",)),
    ("services", ("upslope.runtime", "upslope.lora", "upslope.checkpoint", "upslope.distributed")),
    ("learner", ("upslope.train.learner", "upslope.train.methods")),
    ("train", ("upslope.train", "upslope.eval")),
    ("entry", ("upslope", "upslope.api", "upslope.launch", "upslope.cli", "upslope.eval.cli", "upslope.sweep",
               "upslope.catalog", "upslope.doctor")),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of the module's layer (longest listed prefix); -1 when none is listed."""
    best, found = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    return found


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer, as 'a (layer) -> b (layer)'."""
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if layer_of(b) > layer_of(a):
                out.append(f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})")
    return out


def test_the_layer_check_finds_an_upward_import(tmp_path):
    """The check itself: a core module importing the learner inside a function is an upward edge."""
    graph = {"upslope.batch": {"upslope.train.learner.updater"}, "upslope.train.learner.updater": {"upslope.batch"}}
    assert upward_edges(graph) == ["upslope.batch (core) -> upslope.train.learner.updater (learner)"]
    assert layer_of("upslope.eval.cli") > layer_of("upslope.eval.runner") > layer_of("upslope.rollout.hf")


def test_every_module_has_a_layer():
    missing = [m for m in import_graph() if layer_of(m) < 0]
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def test_layers_only_point_downward():
    """core -> plugins (data, algos, sandbox -> rewards -> agents -> rollout) -> services (runtime, lora,
    checkpoint, distributed) -> learner -> train (and eval) -> entry points: no module imports from a
    layer above its own, at load time or inside a function."""
    found = upward_edges(import_graph())
    assert not found, f"{len(found)} upward imports:\n" + "\n".join(found)
