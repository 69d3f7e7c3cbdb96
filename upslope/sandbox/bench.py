"""Measure the sandbox: per-run overhead of a trivial program, and HumanEval throughput.

    python -m upslope.sandbox.bench [--runs 50] [--humaneval PATH] [--python-args=-S]
"""
import argparse
import os
import statistics
import sys
import time

from upslope.sandbox import FunctionTest, Job, Sandbox, SandboxConfig, SandboxPool, Status, default_workers

# The shared HumanEval copy beside the repository (as the humaneval task finds it).
HUMANEVAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data", "humaneval", "HumanEval.jsonl.gz")


def overhead_ms(config: SandboxConfig, runs: int, weak: bool = False) -> tuple[float, float, float]:
    """Median and 90th-percentile wall time (ms) of `pass`, one run at a time, and the
    median CPU time (ms) of a run (program plus sandbox processes)."""
    sb = Sandbox(config, weak=weak)
    if not sb.mode:
        raise SystemExit(f"sandbox unavailable: {sb.problem}")
    sb.run(Job(code="pass"))  # warm the page cache
    times, cpu = [], []
    for _ in range(runs):
        t = time.perf_counter()
        res = sb.run(Job(code="pass"))
        times.append((time.perf_counter() - t) * 1000)
        cpu.append(res.cpu_s * 1000)
        assert res.status is Status.OK, res
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], statistics.median(cpu)


def bare_ms(config: SandboxConfig, runs: int) -> tuple[float, float]:
    """Median wall and CPU time (ms) of the same interpreter running `pass` with no sandbox."""
    import subprocess

    times, cpu = [], []
    for _ in range(runs):
        t = time.perf_counter()
        proc = subprocess.Popen([config.python, *config.python_args, "-c", "pass"])
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((usage.ru_utime + usage.ru_stime) * 1000)
    return statistics.median(times), statistics.median(cpu)


def _read_jsonl(path: str) -> list[dict]:
    import gzip
    import json

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_rate(
    path: str, config: SandboxConfig, workers: int | None, repeats: int, weak: bool = False
) -> tuple[float, int, int]:
    """Programs per second over the canonical solutions (each with its tests run by the
    checker outside the sandbox, as the `code` reward runs them), best of `repeats`; and how
    many passed. Reads the HumanEval .jsonl(.gz) itself: the sandbox imports nothing of the
    data or reward layers."""
    jobs = [
        Job(code=r["prompt"] + r["canonical_solution"],
            check=FunctionTest(test=r["test"], entry_point=r["entry_point"], prefix=r["prompt"]))
        for r in _read_jsonl(path)
    ]
    best, passed = 0.0, 0
    with SandboxPool(config, workers, weak=weak) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            results = pool.run_many(jobs)
            best = max(best, len(jobs) / (time.perf_counter() - t))
            passed = sum(bool(r.verdict and r.verdict.passed) for r in results)
    return best, passed, len(jobs)


_WORKER = """
import sys, time
from upslope.sandbox import Job, Sandbox, SandboxConfig
sb = Sandbox(SandboxConfig())
sb.run(Job(code="pass"))
for line in sys.stdin:
    t = time.perf_counter()
    res = sb.run(Job(code="pass"))
    print((time.perf_counter() - t) * 1000, res.status, flush=True)
"""


def compare_ms(other_checkout: str, runs: int) -> tuple[float, float, float]:
    """Median wall time (ms) of a trivial program in another checkout's sandbox, in this one's,
    and with no sandbox: measured interleaved (one of each per round), so that the load of a
    busy machine falls on all three alike."""
    import subprocess

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": path})
        for path in (other_checkout, here)
    ]
    times: list[list[float]] = [[], [], []]
    try:
        for _ in range(runs):
            for i, w in enumerate(workers):
                w.stdin.write("go\n")  # type: ignore[union-attr]
                w.stdin.flush()  # type: ignore[union-attr]
                ms, status = w.stdout.readline().split()  # type: ignore[union-attr]
                assert status == "ok", status
                times[i].append(float(ms))
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            times[2].append((time.perf_counter() - t) * 1000)
    finally:
        for w in workers:
            w.stdin.close()  # type: ignore[union-attr]
            w.wait()
    old, new, bare = (statistics.median(t) for t in times)
    return old, new, bare


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--humaneval", default=None, help="HumanEval .jsonl(.gz); default: the shared copy")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--python-args", default="", help="extra interpreter flags, e.g. -S")
    ap.add_argument("--weak", action="store_true", help="measure the weak mode instead")
    ap.add_argument("--against", default=None, help="another checkout: compare its trivial-run overhead with this one's, interleaved")
    args = ap.parse_args(argv)
    if args.against:
        old, new, bare = compare_ms(args.against, args.runs)
        print(f"trivial program, median of {args.runs} interleaved: {args.against}: {old:.1f} ms; this checkout: "
              f"{new:.1f} ms; bare interpreter: {bare:.1f} ms; load average {os.getloadavg()[0]:.1f}")
        return
    config = SandboxConfig(python=args.python, python_args=tuple(args.python_args.split()))
    print(f"mode: {'weak' if args.weak else 'bwrap'}, workers: {args.workers or default_workers()}")
    med, p90, cpu = overhead_ms(config, args.runs, args.weak)
    bare, bare_cpu = bare_ms(config, args.runs)
    print(f"trivial program ({args.python} {args.python_args}): wall median {med:.1f} ms, p90 {p90:.1f} ms, "
          f"CPU {cpu:.1f} ms; the bare interpreter unsandboxed: wall {bare:.1f} ms, CPU {bare_cpu:.1f} ms")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rate, passed, n = humaneval_rate(args.humaneval or HUMANEVAL, config, args.workers, args.repeats, args.weak)
    print(f"HumanEval canonical: {passed}/{n} passed, {rate:.1f} programs/s")


if __name__ == "__main__":
    main()
