"""vLLM from a Python environment whose path has spaces (a clone in "/tmp/my project"): torch's
compiler cannot build there, so vLLM's compiled helpers run uncompiled; and the libraries vLLM adds
to LD_PRELOAD from such a path are dropped, since the loader splits that list at spaces."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from upslope.rollout.vllm import drop_spaced_preloads

COMPILE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import torch
    assert " " in torch.__file__, torch.__file__
    if sys.argv[2] == "workaround":
        from upslope.rollout.vllm import work_around_spaced_install
        work_around_spaced_install()
    rank = torch.compile(lambda x, v: (x >= v).sum(-1))  # what vLLM compiles for log-prob ranks
    print(rank(torch.tensor([[0.1, 0.5, 0.9]]), torch.tensor([[0.5]])).tolist())
""")


def _spaced_site(tmp_path) -> str:
    """This environment's site-packages seen through a path with a space (torch imported from there)."""
    import torch

    site = tmp_path / "my project" / "site-packages"
    site.parent.mkdir()
    site.symlink_to(os.path.dirname(os.path.dirname(torch.__file__)))
    return str(site)


def _run(site: str, mode: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    return subprocess.run([sys.executable, "-c", COMPILE, site, mode], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.ci
@pytest.mark.slow  # imports vLLM in its own process: ~5 s
def test_compiled_helpers_run_from_a_path_with_spaces(tmp_path):
    site = _spaced_site(tmp_path)
    fixed = _run(site, "workaround", tmp_path)
    assert fixed.returncode == 0 and fixed.stdout.strip() == "[2]", fixed.stderr[-2000:]
    said = [line for line in fixed.stderr.splitlines() if "path with spaces" in line]
    assert len(said) == 1 and site in said[0], fixed.stderr


@pytest.mark.slow  # a failing C++ build: about 30 s
def test_without_the_workaround_torchs_compiler_fails_there(tmp_path):
    """The premise: torch's compiler puts the include path unquoted on the compiler's command line."""
    broken = _run(_spaced_site(tmp_path), "plain", tmp_path)
    assert broken.returncode != 0 and "CppCompileError" in broken.stderr, broken.stderr[-2000:]


def test_only_the_spaced_preloads_vllm_added_are_dropped(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/a b/users-own.so")
    before = os.environ["LD_PRELOAD"]
    monkeypatch.setenv("LD_PRELOAD", "/x y/vllm/libs/libtcmalloc.so.4:/opt/a b/users-own.so:/ok/torch/lib/libgomp.so.1")
    drop_spaced_preloads(before)
    assert os.environ["LD_PRELOAD"] == "/opt/a b/users-own.so:/ok/torch/lib/libgomp.so.1"
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("LD_PRELOAD", "/x y/torch/lib/libgomp.so.1")
    drop_spaced_preloads(None)
    assert "LD_PRELOAD" not in os.environ


VLLM_IMPORT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])  # torch and vLLM imported from there
    from upslope.rollout.vllm import configure_vllm_env
    configure_vllm_env()
    import vllm
""")
CONVERSION = "from upslope.models import resolve_model; resolve_model('smollm2-135m-instruct')"


RUN = ["rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8", "log.progress=false",
       "log.tensorboard=false", "log.plot=false", "data.options={count: 16}", "train.threads=1", "engine.name=hf"]


@pytest.mark.ci
@pytest.mark.slow  # four processes, one of them vLLM's import and one a conversion of the real GGUF: ~40 s
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_torchs_compiler_cache_lands_in_upslopes_cache_not_the_temporary_directory(tiny_model_path, tmp_path):
    """The README's first command converts the embedded GGUF into a fresh cache, sets up a trainer and starts vLLM,
    from a clone whose path may have spaces; the conversion, a trainer's set-up (deterministic algorithms import
    torch's compiler settings), vLLM's import and the workaround for such a path each have torch's compiler make
    its cache directory, by default torchinductor_<user> in the temporary directory, left behind after the run."""
    site = _spaced_site(tmp_path)
    model = f"model.name={tiny_model_path}"
    for name, args in (("vllm", ["-c", VLLM_IMPORT, site]), ("conversion", ["-c", CONVERSION]),
                       ("train", ["-m", "upslope.cli", "train", model, "train.steps=1", "train.eval_before=false",
                                  "train.eval_after=false", f"run_dir={tmp_path / 'run'}", *RUN]),
                       ("eval", ["-m", "upslope.cli", "eval", model, f"run_dir={tmp_path / 'eval'}", *RUN])):
        tmp, cache = tmp_path / name / "tmp", tmp_path / name / "cache"
        tmp.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        env.update(TMPDIR=str(tmp), UPSLOPE_CACHE=str(cache), HOME=str(tmp_path / name))
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not [p.name for p in tmp.iterdir() if p.name.startswith("torchinductor")], name
        assert (cache / "torchinductor").is_dir(), name
