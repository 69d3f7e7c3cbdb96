"""The python tool runs the model's code in upslope's sandbox (real bubblewrap): its output comes
back, a hostile program cannot read a host file or reach the network, and a program that hangs is
killed at its limit and reported to the model."""
from __future__ import annotations

import pytest

from upslope.agents import ToolBox
from upslope.agents.formats import PythonBlock
from upslope.registry import TOOLS
from upslope.sandbox import bwrap_problem

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"sandbox unavailable: {bwrap_problem()}")


@pytest.fixture(scope="module")
def box() -> ToolBox:
    """The python tool with room for a slow start on a busy machine."""
    return ToolBox([TOOLS.bind("python", {"timeout_s": 10.0})], PythonBlock(), timeout_s=30, max_chars=2000)


def run(box: ToolBox, code: str) -> str:
    [msg] = box.run(f"```python\n{code}\n```").messages
    return msg["content"]


def test_output_comes_back(box):
    assert run(box, "print(628 * 777)") == "487956\n"
    assert "ZeroDivisionError" in run(box, "1 / 0")


def test_a_hostile_call_cannot_read_a_host_file_or_the_network(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    out = run(box, f"print(open({str(secret)!r}).read())")
    assert "hunter2" not in out and "FileNotFoundError" in out
    out = run(box, "import socket; socket.create_connection(('127.0.0.1', 22), timeout=1); print('CONN' + 'ECTED')")
    assert "CONNECTED" not in out and "Address family not supported" in out  # no network socket can be made


def test_a_hanging_program_is_killed_and_reported():
    box = ToolBox([TOOLS.bind("python", {"timeout_s": 1.5})], PythonBlock(), timeout_s=30)
    out = run(box, "while True: pass")
    assert out.startswith("error: the program ran past its 1.5 s limit")


def test_long_output_is_cut(box):
    box = ToolBox(list(box.tools.values()), PythonBlock(), max_chars=300)
    out = run(box, "print('a' * 5000 + 'z' * 5000)")
    assert out.startswith("a" * 200 + "\n[... 9701 characters cut ...]\n") and out.endswith("z" * 99 + "\n")
