"""What the bad-input catalogs (tests/test_bad_inputs*.py) share: the World each case builds its
inputs from, a Case and the decorator registering one, the finished 1-step run the cases start from,
and the check every case must pass (exit 2, one `upslope: error:` line naming what `expect` says, no
traceback, what `keep` names unchanged)."""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from upslope.cli import main


@dataclass
class World:
    """What the cases build their inputs from: the tiny model, a finished 1-step run (with its
    checkpoint), a second, differently shaped tiny model, and a scratch directory per case."""

    tiny: str
    run: Path
    ckpt: Path
    other_model: str
    tmp: Path

    def base(self, run_dir: Path | None = None, *extra: str) -> list[str]:
        """Overrides for a fast train/eval on the tiny model (hf engine, no progress display, 16
        arithmetic problems instead of 10000 to encode)."""
        return [f"model.name={self.tiny}", "engine.name=hf", f"run_dir={run_dir or self.tmp / 'run'}",
                "log.progress=false", "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2",
                "rollout.n=2", "rollout.max_new_tokens=4", "train.eval_before=false", "train.eval_after=false",
                "train.steps=1", "eval.limit=2", "train.threads=1", "data.options={count: 16}", *extra]

    def file(self, name: str, content: str | bytes) -> Path:
        p = self.tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return p

    def jsonl(self, name: str, rows: list[dict]) -> Path:
        return self.file(name, "".join(json.dumps(r) + "\n" for r in rows))

    def copy_ckpt(self, name: str) -> Path:
        dst = self.tmp / name
        shutil.copytree(self.ckpt, dst)
        return dst


@dataclass
class Case:
    """One malformed input: `build(world)` returns the argv; the error line must contain every
    string of `expect` (the file/line/option at fault); `keep(world)` names what must survive
    unchanged."""

    id: str
    build: Callable[[World], list[str]]
    expect: Callable[[World], list[str]]
    keep: Callable[[World], list[Path]] = field(default=lambda w: [])


def registrar(cases: list[Case]) -> Callable[..., Callable[[Callable[[World], list[str]]], Callable[[World], list[str]]]]:
    """The `case(id, expect, keep)` decorator of a catalog: it appends each case to `cases`."""

    def case(id: str, expect: Callable[[World], list[str]] | list[str],
             keep: Callable[[World], list[Path]] | None = None):
        def register(build: Callable[[World], list[str]]):
            exp = expect if callable(expect) else (lambda w, e=expect: list(e))
            cases.append(Case(id, build, exp, keep or (lambda w: [])))
            return build
        return register

    return case


def build_world(tiny_model_path: str, root: Path) -> World:
    """A finished 1-step run on the tiny model with its checkpoint, and a second tiny model
    of another shape (for resuming from the wrong model's checkpoint), under `root`."""
    from upslope.models import make_tiny_model

    run = root / "run1"
    w = World(tiny_model_path, run, run / "checkpoints" / "step_000001",
              make_tiny_model(tiny_model_path, root / "other", layers=1, hidden=64), root)
    assert main(["train", *w.base(run)]) == 0
    assert (w.ckpt / "COMPLETE").exists()
    return w


def snapshot(paths: list[Path]) -> dict[str, str]:
    """sha1 of every file under `paths` (what must survive a failed command unchanged)."""
    out = {}
    for p in paths:
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()) if p.exists() else []
        for f in files:
            out[str(f)] = hashlib.sha1(f.read_bytes()).hexdigest()
        out[f"{p} exists"] = str(p.exists())
    return out


def check_case(c: Case, world_base: World, tmp_path: Path, capsys, monkeypatch) -> None:
    """Run case `c` in-process from `tmp_path` and check the promise: exit 2, one error line holding
    every string of `c.expect`, no traceback, the files `c.keep` names unchanged."""
    w = World(world_base.tiny, world_base.run, world_base.ckpt, world_base.other_model, tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cwdfile").write_text("in the current directory")
    argv = c.build(w)
    kept = snapshot(c.keep(w))
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err[-3000:], out[-2000:])
    assert len(lines) == 1 and lines[0].startswith("upslope: error: "), err[-3000:]
    assert "Traceback" not in err + out
    for s in c.expect(w):
        assert s in lines[0], (s, lines[0])
    assert snapshot(c.keep(w)) == kept


def catalog_tests(cases: list[Case], scratch: str) -> tuple[Any, Any]:
    """The fixture and the parametrised test a catalog module exposes (assign both at module level):
    one finished run shared by the module's cases, each case checked by `check_case`."""

    @pytest.fixture(scope="module")
    def world_base(tiny_model_path: str, tmp_path_factory: Any) -> World:
        return build_world(tiny_model_path, tmp_path_factory.mktemp(scratch))

    @pytest.mark.parametrize("c", cases, ids=[c.id for c in cases])
    def test_bad_input_gives_one_line(c: Case, world_base: World, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
        check_case(c, world_base, tmp_path, capsys, monkeypatch)

    return world_base, test_bad_input_gives_one_line
