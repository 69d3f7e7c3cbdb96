"""How much code each seed method is: the plugins its recipe names beyond its baseline's, and the hooks a few
methods need in the training loop, counted in source lines, so "a method is a short plugin" is measured.

    python benchmarks/plugin_size.py            # print the table
    python benchmarks/plugin_size.py --write    # write docs/plugin_sizes.md (a test checks it is current)

A method's plugins are the registry names in its own recipe (data.sampler, algo.advantage, rollout.kind,
reward entries, ...) that its baseline's recipe chain does not name. A plugin's code is its registered
function or class plus every module-level function, class or named table of the same module it reaches (transitively),
except other registered plugins (reused, not written for the method): shared helpers of a module count
in full, so the figure is an upper bound. The task's verifier and the multi-turn agent loop a recipe
reuses are not counted, nor is a hook's wiring inside the training loop (a few lines each). Code lines exclude blank lines, comment lines and docstrings;
the "with docstrings" column keeps the docstrings.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from reproduce import METHODS  # noqa: E402

from upslope.registry import REGISTRIES, load_builtins  # noqa: E402

SIZED = [m for m, claim in METHODS.items() if not claim.ablation]  # an ablation adds no plugin

DOC = ROOT / "docs" / "plugin_sizes.md"
LIMIT = 100
# the registry a `{name: ...}` entry at a recipe path belongs to (list indices dropped)
KIND_BY_PATH = {"data.sampler": "sampler", "algo.replay": "replay", "algo.advantage": "advantage",
                "algo.policy_loss": "policy_loss", "algo.filters": "filter", "algo.reward_combiner": "reward_combiner",
                "algo.kl": "kl", "reward": "reward", "distill.loss": "distill_loss", "agent.env": "environment",
                "randopt.consolidate": "consolidate", "rollout.kind": "rollout", "algo.terms": "loss_term",
                "algo.accept": "accept", "dpo.loss": "preference_loss"}
# methods whose mechanism is a hook of the loop switched on by a config section, not a registry name:
# the module-level objects that implement it (method-specific wiring inside the loop is not counted)
HOOKS = {
    "flowtracer": ["upslope.train.learner.salience:attention_flow"],
    "grail": ["upslope.train.learner.salience:gradient_saliency"],
    "arca": ["upslope.train.learner.salience:adapter_residual"],
    "geoalign": ["upslope.train.learner.salience:rollout_features", "upslope.train.learner.salience:hidden_mean"],
    "bmc": ["upslope.train.learner.salience:prompt_features"],
    "geomin": ["upslope.train.learner.salience:rollout_features", "upslope.train.learner.salience:hidden_mean"],
    "saerl": ["upslope.train.learner.salience:prompt_features"],
    "ispo": ["upslope.train.learner.salience:rollout_features", "upslope.train.learner.salience:answer_gain"],
    "pivottrace": ["upslope.train.learner.salience:attention_shift"],
    "dirl": ["upslope.train.learner.salience:rollout_features", "upslope.train.learner.salience:hidden_mean"],
    "pum": ["upslope.train.learner.salience:rollout_features", "upslope.train.learner.salience:hidden_states"],
    "hista": ["upslope.train.learner.salience:rollout_features", "upslope.train.learner.salience:hidden_states"],
    "prism": ["upslope.train.methods.pair_batch:lookahead_step_pairs"],
    "randopt": ["upslope.train.methods.perturb"],
    "corp": ["upslope.train.methods.perturb"],
    "jf_hpo": [f"upslope.sweep.{m}" for m in ("spec", "check", "halving", "trial", "runner", "report", "cli")],
    "csrm": ["upslope.algos.preference:score_calibration_loss", "upslope.train.learner.objectives:BradleyTerryObjective",
             "upslope.train.trainers.rm:score_calibration"],
    # the consistency reward is named by both arms (weight 0 in the baseline, which only measures it)
    "self_ctrl": ["upslope.rewards.introspection:self_consistency"],
    # the environment's read-only execution and query alignment live beside the one-shot SQL reward
    # the two-role rollout is shared with its baseline (which rewards drafts by difficulty); the influence pass
    "infuser": ["upslope.rollout.infuser", "upslope.train.learner.influence",
                *(f"upslope.algos.infuser:{name}" for name in ("infuser", "two_roles", "dual_normalize", "question_index"))],
    "progress_sql": [f"upslope.rewards.sql:{name}" for name in ("ReadOnlyDatabase", "same_result", "extract_sql",
                                                                 "alignment", "differing_clauses")],
}
# infrastructure a recipe names that no seed method wrote: the task's verifier and the multi-turn agent loop
REUSED = {("reward", "integer"), ("reward", "env"), ("rollout", "multi_turn")}


@dataclass(frozen=True)
class Size:
    """Lines of one method's own code."""

    parts: tuple[str, ...]
    code: int
    with_docs: int


def recipe_chain(recipe: str) -> list[dict[str, Any]]:
    """The raw YAML of a recipe and of every recipe it is based on, the recipe first."""
    out, name = [], f"{recipe}.yaml"
    while name:
        raw = yaml.safe_load((ROOT / "recipes" / name).read_text()) or {}
        out.append(raw)
        name = raw.get("base")
    return out


def named_plugins(raw: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(registry kind, name) of every plugin a raw recipe names, found by where it sits."""
    if isinstance(raw, dict):
        if path == "rollout" and isinstance(raw.get("kind"), str):
            yield "rollout", raw["kind"]
        kind = KIND_BY_PATH.get(path)
        if kind and isinstance(raw.get("name"), str):
            yield kind, raw["name"]
        for key, value in raw.items():
            yield from named_plugins(value, f"{path}.{key}" if path else str(key))
    elif isinstance(raw, list):
        for item in raw:
            yield from named_plugins(item, path)


def method_plugins(method: str) -> list[tuple[str, str]]:
    """The plugins a method's own recipe names that its baseline's recipe chain does not."""
    claim = METHODS[method]
    base = {p for raw in recipe_chain(claim.baseline) for p in named_plugins(raw)}
    own = [p for p in named_plugins(recipe_chain(claim.recipe)[0]) if p not in base and p not in REUSED]
    return list(dict.fromkeys(own))


def _registered_objects() -> set[int]:
    return {id(e.fn) for reg in REGISTRIES.values() for e in reg.entries()}


def _defs(tree: ast.Module) -> dict[str, ast.AST]:
    """A module's top-level functions, classes and single-name assignments (a table of helpers) by name."""
    out: dict[str, ast.AST] = {}
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[n.name] = n
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                out[targets[0].id] = n
    return out


def _lines(node: ast.AST, source: list[str]) -> tuple[int, int]:
    """(code lines, lines with docstrings) of a definition: blank and comment-only lines never count."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    docs: set[int] = set()
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if (isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    real = [i for i in range(start, node.end_lineno + 1)
            if source[i - 1].strip() and not source[i - 1].strip().startswith("#")]
    return sum(i not in docs for i in real), len(real)


def closure(module: Any, names: list[str], registered: set[int], own: set[int]) -> set[str]:
    """`names` and every module-level definition of `module` they reach, skipping other registered plugins."""
    defs = _defs(ast.parse(inspect.getsource(module)))
    seen: set[str] = set()
    todo = [n for n in names if n in defs]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for sub in ast.walk(defs[name]):
            ref = sub.id if isinstance(sub, ast.Name) else None
            if ref in defs and ref not in seen:
                obj = getattr(module, ref, None)
                if id(obj) in registered and id(obj) not in own:
                    continue
                todo.append(ref)
    return seen


def _count(targets: dict[str, list[str]], registered: set[int], own: set[int]) -> tuple[int, int]:
    """(code lines, lines with docstrings) of the named objects of each module and what they reach."""
    code = with_docs = 0
    for mod, names in targets.items():
        module = importlib.import_module(mod)
        source = inspect.getsource(module).splitlines()
        defs = _defs(ast.parse("\n".join(source)))
        for name in sorted(closure(module, names, registered, own)):
            c, w = _lines(defs[name], source)
            code, with_docs = code + c, with_docs + w
    return code, with_docs


def size_of(method: str) -> Size:
    """The lines of a method's plugins and hooks (see the module docstring), each part's code lines in its label."""
    load_builtins()
    registered = _registered_objects()
    parts: list[tuple[str, dict[str, list[str]]]] = []  # (label, {module: [object names]})
    own: set[int] = set()
    for kind, name in method_plugins(method):
        entry = REGISTRIES[kind].get(name)
        fn = inspect.unwrap(entry.fn)
        own.add(id(entry.fn))
        parts.append((f"{kind} `{name}`", {fn.__module__: [fn.__qualname__.split(".")[0]]}))
    for ref in HOOKS.get(method, []):
        mod, _, obj = ref.partition(":")
        names = [obj] if obj else list(_defs(ast.parse(inspect.getsource(importlib.import_module(mod)))))
        parts.append((f"`{ref}`" if obj else f"module `{mod}`", {mod: names}))
    union: dict[str, list[str]] = {}
    labels = []
    for label, targets in parts:
        for mod, names in targets.items():
            union.setdefault(mod, []).extend(names)
        labels.append(f"{label} ({_count(targets, registered, own)[0]})" if len(parts) > 1 else label)
    code, with_docs = _count(union, registered, own)
    return Size(tuple(labels), code, with_docs)


# why a method needs more than LIMIT lines
WHY = {
    "treerpo": "two extension points: the tree rollout (branch points, continuations from shared prefixes, the "
               "leaf bookkeeping the learner needs) and the per-segment credit over the tree's nodes; CATPO's "
               "healing shares the rollout module",
    "catpo": "TreeRPO's tree rollout and credit, plus the critique-guided healing of all-fail trees and the "
             "informativeness weighting",
    "progress_sql": "an environment and what it runs on: the read-only SQLite connection (its authorizer, time "
                    "limit and caps), execution-based result comparison, and the clause-level and lexical "
                    "alignment its progress reward and diagnosis read (the last three shared with the one-shot "
                    "reward `sql_execution`)",
    "prism": "TreeRPO's tree rollout, reused (the reward model's baseline samples flat replies, so it counts "
             "here); PRISM's own code is the step-pair builder",
    "jf_hpo": "a command, not a plugin: `upslope sweep` parses and validates the search space against the "
              "config, runs successive halving over subprocess trials resumed from their checkpoints, keeps a "
              "crash-safe state a killed sweep resumes from, and writes the results table and best.yaml",
    "saerl": "a sparse autoencoder fitted at set-up (no pretrained one here) and the three data operations it "
             "drives: clusters mixed within a batch, the easy-to-hard curriculum and the quality filter; the "
             "prompt features are BMC's hook",
    "e3rl": "its own rollout is the shared branch rollout and the erasure rule (54 lines); the rest is TreeRPO's "
            "segment credit (advantage `tree`), reused for the per-segment advantages",
    "infuser": "a new kind of round and a new pass: both roles in one rollout (drafts from each document, their "
               "parsing, the solver's answers, the target rows the influence is measured on) and the influence itself "
               "(a gradient per drafted question against the target rows' gradient under AdamW's preconditioner); "
               "the advantage, its shared two-role core and DuGRPO are the rest",
    "resum": "its own rollout is the shared branch rollout and the mask-or-inject rule (58 lines); the rest is "
             "TreeRPO's segment credit (advantage `tree`), reused for the pair's comparison",
}


def table(methods: list[str]) -> str:
    """The markdown table of every method's size."""
    out = ["| method | its plugins and hooks (code lines each) | code lines | with docstrings | under 100 |",
           "|---|---|---|---|---|"]
    for m in methods:
        s = size_of(m)
        over = f"**no**: {WHY.get(m, 'not explained yet')}"
        out.append(f"| {m} | {', '.join(s.parts) or '(none found)'} | {s.code} | {s.with_docs} | "
                   f"{'yes' if s.code < LIMIT else over} |")
    return "\n".join(out)


def page() -> str:
    """docs/plugin_sizes.md."""
    return ("# How long each seed method's code is\n\n"
            "Generated by `python benchmarks/plugin_size.py --write`; do not edit by hand. "
            + " ".join(__doc__.split("\n\n")[2].split()) + " Commands (`upslope randopt`) count their module.\n\n"
            + table(SIZED) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {DOC.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    if a.write:
        DOC.write_text(page())
        print(f"wrote {DOC}")
    else:
        print(table(SIZED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
