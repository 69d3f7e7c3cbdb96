"""The sandbox runs Python programs wherever the interpreter lives: real virtualenvs under /tmp
(which the run's own /tmp would hide), /dev/shm, a path with spaces, one reached through a
symlink, one whose python is a copy (the standard library found through pyvenv.cfg `home`),
and under /opt and /home; and where it cannot, it says why in one line and runs nothing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from hermetic import ROOT
from sandbox_helpers import needs_bwrap

from upslope.sandbox import FunctionTest, Job, Sandbox, SandboxConfig, Status

pytestmark = needs_bwrap

# name -> (directories the venv's folder may be made in, the first writable one is taken; path
# below that folder; extra `venv` flags). The copied python lives outside /tmp where it can, so
# that only pyvenv.cfg can lead to its standard library.
PLACES = {
    "tmp": (("/tmp",), "venv", ()),
    "spaces": (("/tmp",), "a dir with spaces/my venv", ()),
    "dev_shm": (("/dev/shm",), "venv", ()),
    "copies": (("/opt", "/home", "/tmp"), "venv", ("--copies",)),
    "opt": (("/opt",), "venv", ()),
    "home": (("/home",), "venv", ()),
}


def make_venv(where: Path, flags: tuple[str, ...] = ()) -> str:
    """A real virtualenv (no pip: fast) of this interpreter's base Python; its python's path."""
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(where)], check=True, timeout=120)
    return str(where / "bin" / "python")


@pytest.fixture(scope="module")
def venvs() -> Iterator[dict[str, str]]:
    """Every place of PLACES this user may write to, plus a symlink to the /tmp one; removed after."""
    made: list[str] = []
    out: dict[str, str] = {}
    try:
        for name, (parents, below, flags) in PLACES.items():
            parent = next((p for p in parents if os.access(p, os.W_OK)), None)
            if parent is None:
                continue
            folder = tempfile.mkdtemp(prefix="upslope-venv-", dir=parent)
            made.append(folder)
            os.chmod(folder, 0o755)
            out[name] = make_venv(Path(folder) / below, flags)
        if "tmp" in out:
            link = Path(out["tmp"]).parents[2] / "link to venv"
            link.symlink_to(Path(out["tmp"]).parents[1])
            out["symlink"] = str(link / "bin" / "python")
        yield out
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


PROGRAM = "import json, sys\nprint(json.dumps([sys.prefix, sys.base_prefix]))\ndef add(a, b):\n    return a + b\n"
TEST = "def check(f):\n    assert f(2, 3) == 5\n"


@pytest.mark.parametrize("place", [*PLACES, "symlink"])
def test_a_program_runs_with_the_interpreter_in(place, venvs):
    if place not in venvs:
        pytest.skip(f"cannot write to {' or '.join(PLACES[place][0])} here")
    python = venvs[place]
    sandbox = Sandbox(SandboxConfig(python=python, timeout_s=20))
    assert sandbox.mode == "bwrap", sandbox.problem
    res = sandbox.run(Job(code=PROGRAM))
    assert res.status is Status.OK, res.stderr or res.error
    # the same installation as on the host: the venv, and the base Python it was made from (a
    # copied python would otherwise start on whatever libpython and stdlib /usr offers)
    host = subprocess.run([python, "-c", PROGRAM], capture_output=True, text=True, check=True).stdout
    assert json.loads(res.stdout) == json.loads(host) and json.loads(host)[0] == str(Path(python).parents[1])
    checked = sandbox.run(Job(code=PROGRAM, check=FunctionTest(test=TEST, entry_point="add")))
    assert checked.verdict is not None and checked.verdict.passed, checked.verdict


def test_the_trainers_own_venv_stays_out_of_another_interpreters_view(venvs):
    """Only the configured interpreter's installs are shown: not the trainer's virtualenv."""
    if "tmp" not in venvs or sys.prefix == sys.base_prefix:
        pytest.skip("needs the tests to run from a virtualenv")
    sandbox = Sandbox(SandboxConfig(python=venvs["tmp"]))
    res = sandbox.run(Job(code=f"import os; print(os.path.exists({sys.prefix!r}))"))
    assert res.stdout == "False\n", res.stderr


def test_an_interpreter_that_cannot_start_is_one_line_and_runs_nothing(venvs):
    if os.geteuid() != 0 or "tmp" not in venvs:
        pytest.skip("as root the programs run as an unprivileged uid: a private install is unreadable to it")
    venv = Path(venvs["tmp"]).parents[1]
    venv.chmod(0o700)
    try:
        sandbox = Sandbox(SandboxConfig(python=venvs["tmp"]))
    finally:
        venv.chmod(0o755)
    assert sandbox.mode == "" and "\n" not in sandbox.problem
    assert "cannot start the interpreter" in sandbox.problem and "readable by all users" in sandbox.problem
    res = sandbox.run(Job(code="print(1)"))
    assert res.status is Status.REFUSED and res.error == sandbox.problem


def test_a_missing_interpreter_is_one_line():
    sandbox = Sandbox(SandboxConfig(python="/nonexistent/bin/python3"))
    assert sandbox.mode == "" and sandbox.problem == ("the sandbox's interpreter /nonexistent/bin/python3 does not "
                                                      "exist (SandboxConfig.python)")


@pytest.mark.ci
@pytest.mark.slow  # a training run in its own process: ~6 s
def test_a_run_whose_code_reward_cannot_execute_stops_in_one_line(tiny_model_path, tmp_path):
    """`upslope eval` on HumanEval from an interpreter the sandbox cannot start (a virtualenv only
    its owner may read, as root): the first reward stops the run with the reason, in one line,
    instead of scoring every sample 0."""
    if os.geteuid() != 0:
        pytest.skip("as root the programs run as an unprivileged uid: a private install is unreadable to it")
    python = make_venv(tmp_path / "private" / "venv")
    lib = next((tmp_path / "private" / "venv" / "lib").glob("python3*/site-packages"))
    # the packages this process imports (site-packages, and what .pth files add to them)
    (lib / "trainer.pth").write_text("\n".join([str(ROOT), *(p for p in sys.path if p and os.path.isdir(p))]) + "\n")
    (tmp_path / "private" / "venv").chmod(0o700)
    args = [f"model.name={tiny_model_path}", "engine.name=hf", "eval.data.task=humaneval", "eval.limit=2",
            "eval.max_new_tokens=4", "log.progress=false", f"run_dir={tmp_path / 'run'}"]
    out = subprocess.run([python, "-m", "upslope.cli", "eval", *args], capture_output=True, text=True, timeout=600)
    errors = [line for line in out.stderr.splitlines() if line.startswith("upslope: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert f"reward 'code': the sandbox cannot start the interpreter {python}" in errors[0], errors
    assert "Traceback" not in out.stderr
