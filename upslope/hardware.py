"""What this machine is, and the defaults `auto` picks from it.

`detect()` reads the machine (CPU model and flags, usable cores, memory, GPU, vLLM);
`choose_defaults(hw)` is a pure function of that description, so each kind of machine can be
checked from flags alone. bf16 is chosen only where a matmul micro-benchmark (`matmul_rates`,
run once per CPU model + flags + torch version and cached in ~/.cache/upslope/hardware.json)
measured it faster than fp32: on CPUs without native bf16 (no AVX512-BF16 / AMX, e.g. AVX2-only
EPYC) torch emulates it, 100-300x slower than fp32.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

# CPU flags that decide precision (x86: /proc/cpuinfo "flags"; arm64: "Features")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
FLAGS_SHOWN = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "asimd", "bf16", "sve")
BF16_MARGIN = 1.2  # bf16 must beat fp32 by this factor in the micro-benchmark to be chosen


@dataclass(frozen=True)
class Rates:
    """Measured torch.mm throughput (GFLOP/s) on this machine's CPU."""

    fp32_gflops: float
    bf16_gflops: float

    @property
    def bf16_faster(self) -> bool:
        return self.bf16_gflops >= BF16_MARGIN * self.fp32_gflops


@dataclass(frozen=True)
class Hardware:
    """A machine as `auto` sees it (built by `detect()`, or by hand in tests)."""

    cpu_model: str
    arch: str  # platform.machine(): x86_64, aarch64, arm64
    flags: frozenset[str]
    cores: int  # cores this process may run on (affinity)
    memory_gb: float
    gpu_name: str | None = None
    gpu_capability: tuple[int, int] | None = None
    gpu_memory_gb: float = 0.0
    vllm: bool = False  # a vLLM build is importable
    rates: Rates | None = None  # CPU matmul rates, when measured
    gpu_free_gb: float = 0.0  # free GPU memory when detected (0: take gpu_memory_gb)

    @property
    def native_bf16(self) -> bool:
        return any(f in self.flags for f in NATIVE_BF16_FLAGS)

    def describe(self) -> str:
        shown = [f for f in FLAGS_SHOWN if f in self.flags] or ["none of " + "/".join(FLAGS_SHOWN[:6])]
        gpu = (f"; GPU {self.gpu_name} (capability {self.gpu_capability[0]}.{self.gpu_capability[1]}, "
               f"{self.gpu_memory_gb:.0f} GiB)" if self.gpu_name and self.gpu_capability else "; no GPU")
        return (f"{self.cpu_model} ({self.arch}), {self.cores} cores, {self.memory_gb:.1f} GiB; "
                f"flags: {' '.join(shown)}{gpu}")


@dataclass(frozen=True)
class Defaults:
    """The values `auto` resolves to, each with its reason."""

    precision: str  # train.precision
    model_dtype: str  # model.dtype (learner weights)
    engine_dtype: str  # engine.dtype
    engine_name: str  # engine.name
    state_dtype: str  # optim.state_dtype (what `auto` gives for these weights)
    threads: str  # train.threads=0: how threads are chosen
    micro_batch_tokens: int
    logprob_chunk: int
    kv_cache_max_gb: float  # cap of vLLM's CPU KV cache
    on_gpu: bool = False
    grad_checkpointing: bool = True  # train.grad_checkpointing
    reasons: dict[str, str] = field(default_factory=dict)


def choose_defaults(hw: Hardware) -> Defaults:
    """The defaults for this machine: a pure function of `hw` (rates included)."""
    why: dict[str, str] = {}
    if hw.gpu_capability is not None:
        bf16 = hw.gpu_capability >= (8, 0)
        why["precision"] = (f"GPU capability {hw.gpu_capability[0]}.{hw.gpu_capability[1]} "
                            + ("has bf16 tensor cores" if bf16 else "has no bf16 tensor cores"))
    elif not hw.native_bf16:
        bf16 = False
        why["precision"] = "CPU without native bf16 (no amx_bf16/avx512_bf16): bf16 would be emulated"
    elif hw.rates is None:
        bf16 = False
        why["precision"] = "native bf16 flags but no measurement: fp32 (safe)"
    else:
        bf16 = hw.rates.bf16_faster
        why["precision"] = (f"matmul bf16 {hw.rates.bf16_gflops:.0f} vs fp32 {hw.rates.fp32_gflops:.0f} GFLOP/s"
                            f" ({'bf16' if bf16 else 'fp32'} faster)")
    precision = "bfloat16" if bf16 else "float32"
    model_dtype = weights_dtype(precision, hw.gpu_capability is not None)
    why["model_dtype"] = ("fp32 master weights on a GPU" if hw.gpu_capability is not None else
                          "bf16 weights with bf16 precision" if bf16 else "fp32 weights with fp32 precision")
    engine_dtype = precision
    why["engine_dtype"] = "vllm: same as precision; hf: the learner's weights dtype"
    engine_name = "vllm" if hw.vllm else "hf"
    why["engine_name"] = "vLLM is importable" if hw.vllm else "no vLLM build importable here: HF engine"
    state_dtype = "int8" if model_dtype == "bfloat16" else "float32"
    why["state_dtype"] = ("8-bit moments with bf16 weights" if state_dtype == "int8"
                          else "fp32 moments with fp32 weights")
    why["threads"] = "fitted at each rollout to the cores that are free (a busy core is left out)"
    checkpointing = True
    if hw.gpu_capability is not None:
        free = hw.gpu_free_gb or hw.gpu_memory_gb
        micro = gpu_micro_batch_tokens(free)
        chunk, kv = (1024 if free >= 40 else 512), 1.0
        checkpointing = free < GPU_NO_CHECKPOINT_GB
        why["memory"] = f"GPU with {free:.0f} GiB free"
        why["grad_checkpointing"] = (f"under {GPU_NO_CHECKPOINT_GB} GiB free on the GPU: recompute layers" if checkpointing
                                     else "the GPU has the memory: no recompute (1/3 less learner compute)")
    else:
        why["grad_checkpointing"] = "CPU: activations of a micro-batch would dominate the memory"
        micro = 2048 if hw.memory_gb >= 16 else 1024 if hw.memory_gb >= 8 else 512
        chunk = 256 if hw.memory_gb >= 8 else 128
        kv = min(1.0, max(1, int(hw.memory_gb)) / 16)  # 1/16 of memory, at most 1 GiB
        why["memory"] = f"{hw.memory_gb:.0f} GiB of memory"
    return Defaults(precision, model_dtype, engine_dtype, engine_name, state_dtype, "free cores", micro, chunk, kv,
                    hw.gpu_capability is not None, checkpointing, why)


GPU_NO_CHECKPOINT_GB = 24  # below this much free GPU memory, auto keeps activation checkpointing on


def gpu_micro_batch_tokens(free_gb: float) -> int:
    """The learner's token budget on a GPU with `free_gb` free: 256 tokens a free GiB, rounded
    down to a power of two, within [2048, 16384] (16k tokens of a 1.7B model without
    checkpointing ran on an H200; 65 GiB peak for 16 x 8 x 550 tokens, 2026-12-04)."""
    tokens = 2048
    while tokens * 2 <= min(16384, free_gb * 256):
        tokens *= 2
    return tokens


def learner_device() -> str:
    """Where the learner (and an engine colocated with it) runs: the first GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def weights_dtype(precision: str, on_gpu: bool) -> str:
    """The learner weights' dtype for a precision: bf16 weights with bf16 on a CPU (2 bytes a weight,
    gradient and moment), fp32 master weights on a GPU (bf16 autocast) and with fp32."""
    return "bfloat16" if precision == "bfloat16" and not on_gpu else "float32"


# ---------------------------------------------------------------- detection


def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model in ("", platform.machine(), platform.processor()):
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 8.0


def detect(measure: bool = True, cache: Path | None = None) -> Hardware:
    """This machine; `measure`: add the (cached) matmul rates when its CPU has native bf16."""
    import importlib.util

    import torch

    model, flags = _cpuinfo()
    gpu = cap = None
    gpu_mem = 0.0
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu, cap, gpu_mem = props.name, (props.major, props.minor), props.total_memory / 2**30
    hw = Hardware(model, platform.machine(), flags, usable_cores(), round(_memory_gb(), 1), gpu, cap, gpu_mem,
                  importlib.util.find_spec("vllm") is not None,
                  gpu_free_gb=torch.cuda.mem_get_info(0)[0] / 2**30 if cap is not None else 0.0)
    if measure and hw.native_bf16 and cap is None:
        hw = replace(hw, rates=matmul_rates(cache_key(hw), cache))
    return hw


def cache_key(hw: Hardware) -> str:
    """What the cached rates depend on: CPU model, its flags, the torch version."""
    import torch

    return f"matmul-v2|{hw.cpu_model}|{' '.join(sorted(hw.flags))}|torch {torch.__version__}"


def cache_path() -> Path:
    from upslope.cache import cache_root

    return cache_root() / "hardware.json"


def matmul_rates(key: str, cache: Path | None = None, measure: Callable[[], Rates] | None = None) -> Rates:
    """The cached rates for `key`, measured (and written) when the cache holds another key or none."""
    path = cache or cache_path()
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return Rates(float(saved["fp32_gflops"]), float(saved["bf16_gflops"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rates = (measure or measure_matmul)()
    save_rates(key, rates, path)
    return rates


def save_rates(key: str, rates: Rates, cache: Path | None = None) -> None:
    """Write the cache (one machine key; another key replaces it). A read-only home: skipped."""
    path = cache or cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, **asdict(rates), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
        tmp.replace(path)
    except OSError:
        pass


def measure_matmul(size: int = 512, budget_s: float = 0.5) -> Rates:
    """Best one-thread torch.mm GFLOP/s in fp32 and bf16, about `budget_s` each: square products of growing
    size up to `size`, a size skipped when the rate so far says it would overrun (an emulated bf16
    at 0.3 GFLOP/s never reaches the big ones)."""
    import torch

    def rate(dtype: Any) -> float:
        best, start = 0.0, time.perf_counter()
        n = 128
        while n <= size:
            flop = 2 * n**3
            if best and 2 * flop / (best * 1e9) > budget_s - (time.perf_counter() - start):
                break
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            torch.mm(a, b)  # warm-up
            begin = time.perf_counter()
            while True:
                t = time.perf_counter()
                torch.mm(a, b)
                now = time.perf_counter()
                best = max(best, flop / max(now - t, 1e-9) / 1e9)
                if now - begin > budget_s / 3 or now - start > budget_s:
                    break
            n *= 2
        return best

    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)  # one core: the ratio is what matters, and a busy neighbour core cannot skew it
    try:
        return Rates(round(rate(torch.float32), 1), round(rate(torch.bfloat16), 1))
    finally:
        torch._C.set_num_threads(threads)


@lru_cache(maxsize=1)
def machine() -> Hardware:
    """This machine, detected once per process."""
    return detect()


@lru_cache(maxsize=1)
def machine_defaults() -> Defaults:
    return choose_defaults(machine())


# ---------------------------------------------------------------- a busy machine


def free_cores(window_s: float = 0.05) -> int:
    """Cores of this process's affinity mask that were free over a short window (/proc/stat), at
    least 1: a core another busy process holds is left out, so OpenMP threads never wait on it.
    Time spent in niced processes counts as free where it yields to this process (see
    `niced_work_yields`): a nice-19 job gets ~1.5% of a core against a nice-0 thread."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    before = _cpu_times()
    if not before:
        return len(allowed)
    time.sleep(window_s)
    after = _cpu_times()
    deltas = {cpu: [a - b for a, b in zip(after[cpu], before[cpu])]
              for cpu in allowed if cpu in before and cpu in after}
    return free_from_ticks(deltas.values(), len(allowed), yields_to_us=niced_work_yields())


def free_from_ticks(deltas: Iterable[Sequence[int]], allowed: int, yields_to_us: bool) -> int:
    """Free cores from per-core /proc/stat tick deltas (user, nice, system, idle, iowait, ...):
    idle + iowait, plus nice when niced work yields to this process; rounded with a 0.35 bias
    (a core 65% busy still counts as taken), between 1 and `allowed`."""
    free = 0.0
    for ticks in deltas:
        total = sum(ticks)
        spare = ticks[3] + ticks[4] + (ticks[1] if yields_to_us else 0)
        free += spare / total if total > 0 else 1.0
    return max(1, min(allowed, int(free + 0.35)))


def niced_work_yields() -> bool:
    """Whether other processes' niced CPU time gives way to this process: it is not niced itself,
    and the kernel does not group tasks by session (with sched_autogroup, nice only ranks tasks
    within one session, so a niced job started from another terminal still takes its share)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            return False
    except (AttributeError, OSError):
        return False
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "0"
    except OSError:
        return True  # no autogroup support in this kernel: nice applies machine-wide


def _cpu_times() -> dict[int, list[int]]:
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *ticks = line.split()
            out[int(name[3:])] = [int(x) for x in ticks[:8]]
    return out


_CHECKED_AT = 0.0


def fit_threads(fixed: int = 0, every_s: float = 5.0) -> int:
    """Set torch's thread count: `fixed` when > 0, else the free cores (re-probed at most every
    `every_s` seconds). Uses torch's own setter: vLLM's CPU worker replaces `torch.set_num_threads`
    with a no-op once it has started."""
    import torch

    global _CHECKED_AT
    if fixed > 0:
        n = fixed
    elif time.monotonic() - _CHECKED_AT < every_s:
        return torch.get_num_threads()
    else:
        n = free_cores()
        _CHECKED_AT = time.monotonic()
    if torch.get_num_threads() != n:
        torch._C.set_num_threads(n)
    return n


# ---------------------------------------------------------------- reporting


def summary(d: Defaults, applied: dict[str, Any] | None = None) -> str:
    """One or two lines: the values `auto` picked and why."""
    values = applied if applied is not None else {
        "train.precision": d.precision, "model.dtype": d.model_dtype, "engine.dtype": d.engine_dtype,
        "engine.name": d.engine_name, "optim.state_dtype": d.state_dtype, "train.threads": d.threads,
        "train.micro_batch_tokens": d.micro_batch_tokens, "train.logprob_chunk": d.logprob_chunk,
        "train.grad_checkpointing": d.grad_checkpointing, "engine.kv_cache_gb (max)": d.kv_cache_max_gb}
    if not values:
        return "auto: nothing left to choose (every such option was set)"
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return f"auto: {shown}\n  why: {d.reasons.get('precision', '')}; {d.reasons.get('memory', '')}"


def record(hw: Hardware, d: Defaults, applied: dict[str, Any]) -> dict[str, Any]:
    """What run_dir/hardware.json holds: the machine, the rates, the values auto applied and why."""
    out = asdict(hw)
    out["flags"] = sorted(f for f in hw.flags if f in FLAGS_SHOWN)
    return {"hardware": out, "auto_applied": applied, "reasons": d.reasons, "defaults": {
        k: v for k, v in asdict(d).items() if k != "reasons"}}
