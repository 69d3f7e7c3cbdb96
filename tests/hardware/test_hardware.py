"""`auto` defaults from the hardware: the decision for each kind of machine (flags given, not
detected), the per-machine cache of the matmul micro-benchmark, explicit settings winning, the
run directory's record, threads fitted to the free cores, and `upslope doctor` on this machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope import hardware
from upslope.cli import main
from upslope.config import AUTO_KEYS, load_config
from upslope.errors import ConfigError
from upslope.hardware import Hardware, Rates, choose_defaults

X86_AVX512 = frozenset("fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_tile amx_bf16 amx_int8".split())
X86_AVX2 = frozenset("fpu sse2 avx avx2 fma".split())
ARM_M1 = frozenset("fp asimd aes crc32 atomics".split())  # Apple M1 under Linux: no BF16 extension
ARM_BF16 = frozenset("fp asimd sve bf16 i8mm".split())  # Graviton 3 / Neoverse V1

AMX_XEON = Hardware("Intel(R) Xeon(R) Platinum 8480+", "x86_64", X86_AVX512, 2, 23.5, vllm=True,
                    rates=Rates(fp32_gflops=305.0, bf16_gflops=1850.0))
AVX2_EPYC = Hardware("AMD EPYC 7B12", "x86_64", X86_AVX2, 2, 23.5, vllm=True)
APPLE_ARM = Hardware("Apple M2", "arm64", ARM_M1, 8, 16.0, vllm=False)
H200 = Hardware("Intel(R) Xeon(R) Platinum 8468", "x86_64", X86_AVX512, 16, 128.0, "NVIDIA H200", (9, 0), 139.8,
                vllm=True)
LAPTOP = Hardware("Intel(R) Core(TM) i5-1135G7", "x86_64", X86_AVX2 | {"avx512f"}, 4, 6.0, vllm=True)


def test_amx_xeon_measured_bf16_faster_gets_bf16_everywhere():
    d = choose_defaults(AMX_XEON)
    assert (d.precision, d.model_dtype, d.engine_dtype, d.state_dtype) == ("bfloat16", "bfloat16", "bfloat16", "int8")
    assert (d.engine_name, d.micro_batch_tokens, d.logprob_chunk, d.kv_cache_max_gb) == ("vllm", 2048, 256, 1.0)
    assert "1850 vs fp32 305" in d.reasons["precision"] and not d.on_gpu


def test_avx2_epyc_gets_fp32_without_measuring():
    """No avx512_bf16 / amx_bf16: bf16 is emulated (0.3 vs 93 GFLOP/s there), fp32 throughout."""
    assert not AVX2_EPYC.native_bf16
    d = choose_defaults(AVX2_EPYC)
    assert (d.precision, d.model_dtype, d.engine_dtype, d.state_dtype) == ("float32", "float32", "float32", "float32")
    assert "emulated" in d.reasons["precision"] and d.engine_name == "vllm"


def test_native_flags_but_bf16_measured_slower_gets_fp32():
    slow = replace(AMX_XEON, rates=Rates(fp32_gflops=100.0, bf16_gflops=110.0))  # < 1.2x: not worth it
    assert choose_defaults(slow).precision == "float32"
    unmeasured = replace(AMX_XEON, rates=None)
    assert choose_defaults(unmeasured).precision == "float32"
    arm = Hardware("Neoverse-V1", "aarch64", ARM_BF16, 4, 16.0, rates=Rates(50.0, 20.0))
    assert arm.native_bf16 and choose_defaults(arm).precision == "float32"
    assert choose_defaults(replace(arm, rates=Rates(50.0, 61.0))).precision == "bfloat16"  # 1.22x


def test_apple_arm64_without_vllm_falls_back_to_hf():
    d = choose_defaults(APPLE_ARM)
    assert d.engine_name == "hf" and "no vLLM" in d.reasons["engine_name"]
    assert d.precision == "float32" and d.micro_batch_tokens == 2048 and d.kv_cache_max_gb == 1.0


def test_h200_like_gpu_gets_bf16_autocast_over_fp32_master_weights():
    d = choose_defaults(H200)
    assert (d.precision, d.model_dtype, d.engine_dtype, d.state_dtype) == ("bfloat16", "float32", "bfloat16", "float32")
    assert (d.micro_batch_tokens, d.logprob_chunk, d.on_gpu) == (16384, 1024, True)
    assert "9.0" in d.reasons["precision"]
    old = choose_defaults(replace(H200, gpu_name="Tesla V100", gpu_capability=(7, 0), gpu_memory_gb=16.0))
    assert (old.precision, old.engine_dtype, old.micro_batch_tokens, old.logprob_chunk) == (
        "float32", "float32", 4096, 512)


def test_gpu_checkpointing_and_micro_batch_follow_free_memory():
    """Without checkpointing where the GPU has the memory (1/3 less compute), with it on a small or
    busy GPU; the token budget is 256 a free GiB as a power of two in [2048, 16384]; CPUs keep it on."""
    assert not choose_defaults(H200).grad_checkpointing
    busy = choose_defaults(replace(H200, gpu_free_gb=20.0))
    assert busy.grad_checkpointing and busy.micro_batch_tokens == 4096 and "20 GiB free" in busy.reasons["memory"]
    assert [hardware.gpu_micro_batch_tokens(gb) for gb in (4, 16, 40, 64, 80, 139.8)] == [
        2048, 4096, 8192, 16384, 16384, 16384]
    assert all(choose_defaults(hw).grad_checkpointing for hw in (AMX_XEON, AVX2_EPYC, APPLE_ARM, LAPTOP))


def test_low_memory_laptop_gets_small_batches_and_cache():
    d = choose_defaults(LAPTOP)
    assert d.precision == "float32"  # avx512f alone is not native bf16
    assert (d.micro_batch_tokens, d.logprob_chunk, d.kv_cache_max_gb) == (512, 128, 6 / 16)
    assert choose_defaults(replace(LAPTOP, memory_gb=12.0)).micro_batch_tokens == 1024


@settings(max_examples=200, deadline=None)
@given(flags=st.sets(st.sampled_from(sorted(X86_AVX512 | ARM_BF16))), memory=st.floats(1, 2048),
       fp32=st.floats(0.1, 1e4), bf16=st.floats(0.1, 1e4), cap=st.one_of(st.none(), st.tuples(
           st.integers(3, 10), st.integers(0, 9))), vllm=st.booleans())
def test_bf16_only_where_native_and_measured_faster(flags, memory, fp32, bf16, cap, vllm):
    hw = Hardware("cpu", "x86_64", frozenset(flags), 2, memory, "gpu" if cap else None, cap, memory, vllm,
                  Rates(fp32, bf16))
    d = choose_defaults(hw)
    cpu_bf16 = cap is None and hw.native_bf16 and bf16 >= 1.2 * fp32
    assert (d.precision == "bfloat16") == (cpu_bf16 or (cap is not None and cap >= (8, 0)))
    assert d.model_dtype == ("bfloat16" if d.precision == "bfloat16" and cap is None else "float32")
    assert d.state_dtype == ("int8" if d.model_dtype == "bfloat16" else "float32")
    assert d.engine_name == ("vllm" if vllm else "hf") and d.engine_dtype == d.precision
    assert 16 <= d.micro_batch_tokens and 0 < d.kv_cache_max_gb <= 1.0


# ---------------------------------------------------------------- the cache


def counted_measure(calls: list[int]):
    def measure() -> Rates:
        calls.append(1)
        return hardware.measure_matmul(size=128, budget_s=0.05)
    return measure


def test_rates_cache_written_once_reused_and_invalidated_by_another_key(tmp_path):
    path, calls = tmp_path / "hardware.json", []
    first = hardware.matmul_rates("cpu A|avx2|torch 1", path, counted_measure(calls))
    assert len(calls) == 1 and first.fp32_gflops > 0 and first.bf16_gflops > 0
    saved = json.loads(path.read_text())
    assert saved["key"] == "cpu A|avx2|torch 1" and saved["fp32_gflops"] == first.fp32_gflops
    again = hardware.matmul_rates("cpu A|avx2|torch 1", path, counted_measure(calls))
    assert again == first and len(calls) == 1 and json.loads(path.read_text()) == saved  # reused, not measured
    other = hardware.matmul_rates("cpu A|avx2|torch 2", path, counted_measure(calls))  # torch upgraded
    assert len(calls) == 2 and json.loads(path.read_text())["key"] == "cpu A|avx2|torch 2"
    assert other.fp32_gflops > 0
    path.write_text("{not json")  # a damaged cache is measured again and rewritten
    hardware.matmul_rates("cpu A|avx2|torch 2", path, counted_measure(calls))
    assert len(calls) == 3 and json.loads(path.read_text())["key"] == "cpu A|avx2|torch 2"


def test_cache_key_names_cpu_model_flags_and_torch_version():
    key = hardware.cache_key(AVX2_EPYC)
    assert "AMD EPYC 7B12" in key and "avx2 fma" in key and torch.__version__ in key
    assert key != hardware.cache_key(replace(AVX2_EPYC, flags=AVX2_EPYC.flags | {"avx512_bf16"}))


def test_detect_this_machine_measures_only_where_bf16_is_native(tmp_path):
    hw = hardware.detect(cache=tmp_path / "hw.json")
    text = open("/proc/cpuinfo").read()
    assert hw.cpu_model in text and hw.cores == len(os.sched_getaffinity(0)) and hw.memory_gb > 0.5
    assert hw.native_bf16 == any(f" {flag}" in text for flag in ("amx_bf16", "avx512_bf16"))
    assert (hw.rates is not None) == (hw.native_bf16 and hw.gpu_capability is None)
    assert (tmp_path / "hw.json").exists() == (hw.rates is not None)


def test_measure_matmul_stays_within_its_budget():
    start = time.perf_counter()
    rates = hardware.measure_matmul(budget_s=0.3)
    assert time.perf_counter() - start < 5.0  # 2 x 0.3 s of products, plus warm-ups (a loaded machine)
    assert rates.fp32_gflops > 0.1 and rates.bf16_gflops > 0.01


# ---------------------------------------------------------------- config: explicit settings win


def test_default_config_takes_this_machines_choices():
    d = hardware.machine_defaults()
    cfg = load_config()
    assert (cfg.train.precision, cfg.model.dtype, cfg.engine.dtype) == (d.precision, d.model_dtype, d.engine_dtype)
    assert (cfg.train.micro_batch_tokens, cfg.train.logprob_chunk) == (d.micro_batch_tokens, d.logprob_chunk)
    assert set(cfg.auto_choices()) == set(AUTO_KEYS)
    assert load_config(None, ["train.precision=auto"]).train.precision == d.precision


def test_explicit_settings_win_over_auto():
    cfg = load_config(None, ["train.precision=float32", "engine.dtype=float16", "train.micro_batch_tokens=640",
                             "train.logprob_chunk=32", "train.grad_checkpointing=false"])
    assert not cfg.train.grad_checkpointing
    assert (cfg.train.precision, cfg.model.dtype, cfg.engine.dtype) == ("float32", "float32", "float16")
    hf = load_config(None, ["train.precision=float32", "engine.name=hf"])
    assert hf.engine.dtype == "float32"  # the HF engine follows the learner's weights
    if hardware.machine_defaults().engine_name == "vllm":
        assert load_config(None, ["train.precision=float32"]).engine.dtype == hardware.machine_defaults().engine_dtype
    assert (cfg.train.micro_batch_tokens, cfg.train.logprob_chunk) == (640, 32)
    assert set(cfg.auto_choices()) == {"model.dtype"}  # derived from the explicit precision
    mixed = load_config(None, ["train.precision=bfloat16", "model.dtype=float32"])
    assert (mixed.train.precision, mixed.model.dtype) == ("bfloat16", "float32")
    assert "train.precision" not in mixed.auto_choices() and "model.dtype" not in mixed.auto_choices()
    cpu_bf16 = load_config(None, ["train.precision=bfloat16"])
    assert cpu_bf16.model.dtype == hardware.weights_dtype("bfloat16", hardware.machine_defaults().on_gpu)


def test_recipe_values_win_and_the_resolved_config_shows_concrete_values(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  precision: float32\n  logprob_chunk: 64\n")
    cfg = load_config(recipe)
    assert (cfg.train.precision, cfg.train.logprob_chunk) == ("float32", 64)
    assert main(["config", "show", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "precision: float32" in out and "logprob_chunk: 64" in out and ": auto" not in out.split("engine:")[0]


@pytest.mark.parametrize("override, key", [("train.precision=fp8", "train.precision"),
                                           ("train.micro_batch_tokens=8", "train.micro_batch_tokens"),
                                           ("train.logprob_chunk=some", "train.logprob_chunk")])
def test_bad_auto_option_values_are_one_line_errors(override, key, capsys):
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override])
    assert main(["config", "show", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err


def test_run_dir_records_what_auto_chose(tmp_path):
    from upslope.runtime import announce_hardware

    lines: list[str] = []
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "train.logprob_chunk=64", "train.threads=1"])
    announce_hardware(cfg, lines.append)
    record = json.loads((tmp_path / "run" / "hardware.json").read_text())
    assert record["auto_applied"]["train.precision"] == cfg.train.precision
    assert "train.logprob_chunk" not in record["auto_applied"] and "train.threads" not in record["auto_applied"]
    assert record["hardware"]["cpu_model"] == hardware.machine().cpu_model
    assert record["reasons"]["precision"] == hardware.machine_defaults().reasons["precision"]
    assert len(lines) == 1 and lines[0].count("\n") == 1 and f"train.precision={cfg.train.precision}" in lines[0]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="run_dir="):
        announce_hardware(load_config(None, [f"run_dir={tmp_path / 'file' / 'run'}"]), lines.append)


# ---------------------------------------------------------------- a busy machine


def test_busy_cores_are_left_out_of_the_thread_count():
    allowed = os.sched_getaffinity(0)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in allowed]
    threads = torch.get_num_threads()
    try:
        time.sleep(0.5)
        assert hardware.free_cores(window_s=0.2) == 1  # every core busy: one thread, never zero
        hardware._CHECKED_AT = 0.0
        assert hardware.fit_threads(0) == 1 and torch.get_num_threads() == 1
        assert hardware.fit_threads(3) == 3 and torch.get_num_threads() == 3  # an explicit count wins
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        torch.set_num_threads(threads)
    assert 1 <= hardware.free_cores() <= len(allowed)


def test_free_cores_from_ticks_by_hand():
    # (user, nice, system, idle, iowait, irq, softirq, steal) deltas over the window, per core
    idle_core, busy_core, niced_core = [0, 0, 0, 10, 0, 0, 0, 0], [9, 0, 1, 0, 0, 0, 0, 0], [0, 10, 0, 0, 0, 0, 0, 0]
    assert hardware.free_from_ticks([idle_core, idle_core], 2, yields_to_us=True) == 2
    assert hardware.free_from_ticks([idle_core, busy_core], 2, yields_to_us=True) == 1
    assert hardware.free_from_ticks([busy_core, busy_core], 2, yields_to_us=True) == 1  # never 0
    assert hardware.free_from_ticks([idle_core, niced_core], 2, yields_to_us=True) == 2  # niced work yields
    assert hardware.free_from_ticks([idle_core, niced_core], 2, yields_to_us=False) == 1  # ... not to a niced run
    half = [5, 0, 0, 5, 0, 0, 0, 0]  # 50% busy: 0.5 + 0.5 + 0.35 rounds down to 1 of 2 free
    assert hardware.free_from_ticks([half, half], 2, yields_to_us=True) == 1
    assert hardware.free_from_ticks([[0] * 8, idle_core], 2, yields_to_us=True) == 2  # no ticks: free
    assert hardware.free_from_ticks([idle_core] * 4, 2, yields_to_us=True) == 2  # capped at the allowed cores


def test_niced_busy_processes_do_not_take_cores_from_a_normal_run():
    if not hardware.niced_work_yields():
        pytest.skip("niced work does not yield here (this process is niced, or sched_autogroup is on)")
    allowed = sorted(os.sched_getaffinity(0))
    hogs = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"]) for _ in allowed]
    try:
        time.sleep(0.5)
        before = hardware._cpu_times()
        time.sleep(0.3)
        after = hardware._cpu_times()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    deltas = [[a - b for a, b in zip(after[c], before[c])] for c in allowed]
    normal_busy = sum(d[0] + d[2] for d in deltas) / max(1, sum(sum(d) for d in deltas))
    if normal_busy > 0.1:
        pytest.skip(f"other work at normal priority took {normal_busy:.0%} of the cores: needs a quiet machine")
    assert sum(d[1] for d in deltas) > 0  # the kernel books the hogs as nice time ...
    assert hardware.free_from_ticks(deltas, len(allowed), yields_to_us=True) == len(allowed)  # ... which yields
    assert hardware.free_from_ticks(deltas, len(allowed), yields_to_us=False) == 1


def test_deterministic_runs_keep_one_thread_count():
    from upslope.runtime import engine_threads

    assert engine_threads(load_config()) == 0  # fitted to the free cores
    assert engine_threads(load_config(None, ["train.deterministic=true"])) == len(os.sched_getaffinity(0))
    assert engine_threads(load_config(None, ["train.deterministic=true", "train.threads=1"])) == 1


# ---------------------------------------------------------------- upslope doctor


@pytest.mark.ci
@pytest.mark.slow  # measures this machine's matmul peaks: ~5 s
def test_doctor_reports_this_machine(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("UPSLOPE_CACHE", str(tmp_path))  # doctor re-measures and rewrites the rates cache
    assert main(["doctor"]) == 0
    assert json.loads((tmp_path / "hardware.json").read_text())["key"].startswith("matmul-v2|")
    out = capsys.readouterr().out
    hw = hardware.detect(measure=False)
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert hw.cpu_model in lines["cpu"] and f"{hw.cores} cores" in lines["cpu"]
    for flag in ("avx2", "avx512_bf16", "amx_bf16"):
        assert (flag in lines["flags"].split()) == (flag in hw.flags)
    fp32, bf16 = [float(w) for w in lines["matmul"].replace(",", "").split() if w.replace(".", "").isdigit()][:2]
    assert fp32 > 0 and bf16 > 0
    assert ("importable" in lines["vllm"]) == hw.vllm or "fails" in lines["vllm"]
    assert "sandbox" in lines and "ray" in lines
    from upslope.sandbox import bwrap_problem

    if bwrap_problem() is None:  # a real run: the interpreter starts, and how memory is limited
        assert f"runs {sys.executable}" in lines["sandbox"] and "memory_mb=1024 per process" in lines["sandbox"]
    else:
        assert lines["sandbox"].startswith("sandbox  cannot run code: ")
    d = choose_defaults(replace(hw, rates=Rates(fp32, bf16)))
    assert f"train.precision={d.precision}" in lines["auto:"] and f"engine.name={d.engine_name}" in lines["auto:"]


def test_doctor_takes_no_arguments(capsys):
    assert main(["doctor", "extra"]) == 2
    assert "usage: upslope doctor" in capsys.readouterr().err
