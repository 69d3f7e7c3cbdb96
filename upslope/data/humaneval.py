"""HumanEval (Chen et al., 2021): 164 Python functions to complete, scored by their unit tests.

Each record gives the function's signature and docstring (`prompt`), a reference body
(`canonical_solution`), a `test` block defining `check(candidate)`, and the `entry_point`.
The `code` reward runs prompt + completion + test + `check(entry_point)` in the sandbox.
"""

import os
from pathlib import Path

from upslope.data.sources import read_records
from upslope.data.paths import shared_data_dir
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.registry import TASKS

# The shipped copy: $UPSLOPE_DATA_DIR/humaneval, else <repo>/../shared/data/humaneval (as every built-in task)
DEFAULT_PATH = str(shared_data_dir() / "humaneval" / "HumanEval.jsonl.gz")
_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")

INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function "
    "(signature included) in a single ```python code block.\n\n```python\n{prompt}```"
)


def _resolve(path: str) -> Path:
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        for name in ("HumanEval.jsonl.gz", "HumanEval.jsonl"):
            if (p / name).is_file():
                return p / name
        raise DataError(f"{p}: no HumanEval.jsonl.gz or HumanEval.jsonl in this directory")
    if not p.is_file():
        raise DataError(f"{p}: HumanEval file not found")
    return p


def load_humaneval(path: str = DEFAULT_PATH, limit: int | None = None) -> list[Example]:
    """Read HumanEval from a .jsonl or .jsonl.gz file (or a directory holding one).

    Each Example: a chat prompt asking for the completed function, answer None, and meta
    with `test`, `entry_point`, `code_prefix` (the original prompt, so that a completion
    giving only the body still runs), `task_id` and `canonical_solution`.
    """
    out: list[Example] = []
    try:
        for where, row in read_records(_resolve(path)):
            if limit is not None and len(out) >= limit:
                break
            missing = [k for k in _FIELDS if not isinstance(row.get(k), str)]
            if missing:
                raise DataError(f"{where}: missing or non-string field(s) {', '.join(missing)}")
            out.append(_example(row))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    return out


def _example(row: dict) -> Example:
    prompt = row["prompt"]
    return Example(
        prompt=[{"role": "user", "content": INSTRUCTION.format(prompt=prompt)}],
        answer=None,
        meta={
            "task_id": row["task_id"],
            "entry_point": row["entry_point"],
            "code_prefix": prompt,
            "test": row["test"],
            "canonical_solution": row["canonical_solution"],
        },
        id=row["task_id"],
    )


@TASKS.register("humaneval", reward="code", max_new_tokens=384)
def humaneval(*, path: str = DEFAULT_PATH, limit: int | None = None) -> list[Example]:
    """HumanEval: complete 164 Python functions; scored by running their unit tests (reward `code`).

    path: HumanEval .jsonl or .jsonl.gz file, or a directory holding one (default: the shared copy)
    limit: read at most this many problems (null: all 164)
    """
    return load_humaneval(path, limit)
