"""The suite runs off the user's files: each test in an empty directory of its own with a temporary
HOME, model cache and temp dir, and the guard that fails the session sees what a test would leave behind."""
from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

from hermetic import NOT_GUARDED, ROOT, SESSION_PREFIX, new_in_temp_dir, new_or_changed, snapshot, top_level_names

from upslope.cli import main
from upslope.cache import cache_root


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def test_each_test_starts_in_an_empty_directory_with_a_temporary_home():
    cwd, home = Path.cwd(), Path.home()
    assert not any(cwd.iterdir()) and not any(home.iterdir())
    assert not _inside(cwd, ROOT) and not _inside(home, ROOT) and cwd != home
    user_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert not _inside(home, user_home) and not _inside(cache_root(), user_home) and not _inside(cache_root(), ROOT)


def test_a_command_with_the_default_run_dir_writes_beside_the_test(tiny_model_path, capsys):
    """`run_dir=runs/default` (the default) lands in the test's own directory: a run the user left
    in the checkout is neither read nor overwritten."""
    args = [f"model.name={tiny_model_path}", "engine.name=hf", "log.progress=false", "log.tensorboard=false",
            "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
            "train.eval_before=false", "train.eval_after=false", "train.steps=1", "train.threads=1",
            "data.options={count: 16}"]
    assert main(["train", *args]) == 0, capsys.readouterr().err
    assert (Path.cwd() / "runs" / "default" / "metrics.jsonl").is_file()


def test_a_subprocess_imports_this_checkout_from_its_temporary_directory():
    out = subprocess.run([sys.executable, "-c", "import upslope; print(upslope.__file__)"], capture_output=True,
                         text=True, check=True)
    assert Path(out.stdout.strip()).resolve() == (ROOT / "upslope" / "__init__.py").resolve()


def test_the_guard_names_what_a_session_left_and_ignores_tool_caches(tmp_path):
    tree = tmp_path / "checkout"
    (tree / "upslope").mkdir(parents=True)
    (tree / "upslope" / "a.py").write_text("x = 1\n")
    before = snapshot(tree, NOT_GUARDED)
    (tree / "runs" / "default").mkdir(parents=True)
    (tree / "runs" / "default" / "metrics.jsonl").write_text("{}\n")
    (tree / "upslope" / "__pycache__").mkdir()
    (tree / "upslope" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tree / ".hypothesis").mkdir()
    (tree / "notes.txt").write_text("left behind\n")
    assert new_or_changed(before, snapshot(tree, NOT_GUARDED), changes=False) == ["notes.txt", "runs"]
    # the user's cache: a new file and a rewritten one both count
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "hardware.json").write_text("{}")
    before = snapshot(cache)
    (cache / "hardware.json").write_text('{"key": 1}')
    (cache / "models" / "new").mkdir()
    assert new_or_changed(before, snapshot(cache)) == [os.path.join("models", "new"), "hardware.json"]


def test_temporary_files_of_the_test_and_its_subprocesses_land_in_the_sessions_temp_dir(tmp_path):
    """TMPDIR points into the session's directory: what a test, a library or a subprocess makes with
    `tempfile` (pytest's `tmp_path` included) is removed with the session, not left in a shared /tmp."""
    session_tmp = Path(tempfile.gettempdir())
    assert session_tmp.name == "tmp" and session_tmp.parent.name.startswith(SESSION_PREFIX)
    assert os.environ["TMPDIR"] == str(session_tmp) and _inside(tmp_path, session_tmp)
    out = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"], capture_output=True,
                         text=True, check=True)
    assert _inside(Path(out.stdout.strip()), session_tmp)


def test_the_guard_names_what_a_session_left_in_the_system_temp_dir(tmp_path):
    system_tmp = tmp_path / "tmp"
    (system_tmp / "someone-elses").mkdir(parents=True)
    before = top_level_names(system_tmp)
    (system_tmp / "someone-elses" / "file").write_text("")  # inside a directory that was there: not compared
    (system_tmp / "vllm_dist_0a1b").write_bytes(b"\0")
    (system_tmp / "tmpabc123").mkdir()
    (system_tmp / f"{SESSION_PREFIX}x1y2z3").mkdir()  # a session's own directory, removed by that session
    assert new_in_temp_dir(before, system_tmp) == ["tmpabc123", "vllm_dist_0a1b"]
    assert new_in_temp_dir(before, tmp_path / "missing") == []
