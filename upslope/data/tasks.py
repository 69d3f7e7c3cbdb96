"""Built-in tasks, registered in TASKS. Each returns Examples and names its default reward.

A task function takes `split` ("train" or "test") and keyword options; the registry entry's
`reward` attribute (and `reward_options`) is the reward used when the config names none.
"""
from __future__ import annotations

import random
from pathlib import Path

from upslope.bounds import PositiveCount
from upslope.data.paths import shared_data_dir
from upslope.data.sources import read_records, records_to_examples
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.registry import TASKS

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_TEST_SEED_OFFSET = 1_000_003


def _data_file(path: str | None, *parts: str) -> Path:
    p = Path(path).expanduser() if path else shared_data_dir().joinpath(*parts)
    if not p.exists():
        raise DataError(f"{p}: data file not found (pass data.options.path=... or set UPSLOPE_DATA_DIR)")
    return p


@TASKS.register("arith", reward="integer", reward_options={"extract": "first_result", "strict": True}, max_new_tokens=8,
                splits=("train", "test"))
def arith(*, split: str = "train", ops: str = "*", digits: PositiveCount = 1, count: PositiveCount = 10000,
          seed: int = 0,
          allow_zero: bool = False, prompt: str = "What is {a} {op} {b}?", prefill: str = "") -> list[Example]:
    """Seeded procedural arithmetic: `count` problems `a op b` with `digits`-digit operands;
    the answer is the integer result. The test split uses a different seed.

    split: "train" or "test" (the test split uses a different seed)
    ops: operations drawn from, a string of any of "+", "-", "*" (e.g. "+-")
    digits: digits of each operand (>= 1)
    count: number of problems
    seed: random seed (the test split adds a fixed offset)
    allow_zero: with 1-digit operands, allow the operand 0
    prompt: format string of the question, with {a}, {op} and {b}
    prefill: format string the assistant's reply starts with, continued by the model (empty: none)

    Each example's meta holds a, b, op and `carries`, a difficulty field to cluster by: the
    column carries of a + b, the borrows of max - min for -, the digit products >= 10 for *.
    """
    _check_split("arith", split, ("train", "test"))
    for op in ops:
        if op not in _OPS:
            raise DataError(f"data.options.ops: unknown operation '{op}' (use any of + - *)")
    if digits < 1:
        raise DataError("data.options.digits: must be at least 1")
    rng = random.Random(seed + (_TEST_SEED_OFFSET if split == "test" else 0))
    lo = 0 if allow_zero else 1
    lo = max(lo, 10 ** (digits - 1)) if digits > 1 else lo
    hi = 10 ** digits - 1
    out = []
    for i in range(count):
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
        out.append(Example(prompt=prompt.format(a=a, b=b, op=op), answer=_OPS[op](a, b),
                           meta={"a": a, "b": b, "op": op, "carries": carries(a, b, op)}, id=f"arith-{split}-{i}",
                           prefill=prefill.format(a=a, b=b, op=op)))
    return out


def carries(a: int, b: int, op: str) -> int:
    """Digit-level carries of `a op b` (a, b >= 0): column carries of a + b, borrows of max - min,
    digit products of 10 or more for *."""
    da, db = [int(c) for c in str(a)[::-1]], [int(c) for c in str(b)[::-1]]
    if op == "*":
        return sum(x * y >= 10 for x in da for y in db)
    if op == "-" and b > a:
        da, db = db, da
    count = carry = 0
    for i in range(max(len(da), len(db))):
        x, y = (da[i] if i < len(da) else 0), (db[i] if i < len(db) else 0)
        carry = int(x + y + carry >= 10) if op == "+" else int(x - y - carry < 0)
        count += carry
    return count


def _check_split(task: str, split: str, splits: tuple[str, ...]) -> None:
    if split not in splits:
        raise DataError(f"data.split={split!r}: task '{task}' has only the split(s) {', '.join(splits)}")


def _gsm8k_answer(text: str) -> str:
    return text.split("####")[-1].strip().replace(",", "")


@TASKS.register("gsm8k", reward="math", max_new_tokens=256, splits=("train", "test"))
def gsm8k(*, split: str = "test", path: str | None = None,
          instruction: str = "{prompt}\nPut your final answer after '####'.") -> list[Example]:
    """Grade-school math word problems (GSM8K); the reference is the number after '####'.

    split: which file, gsm8k/<split>.jsonl in the shared data ("train" or "test")
    path: a .jsonl file to read instead (fields question, answer)
    instruction: prompt template; {prompt} is the question
    """
    file = _data_file(path, "gsm8k", f"{split}.jsonl")
    examples = records_to_examples(read_records(file), prompt_field="question", answer_field="answer",
                                   template=instruction)
    for ex in examples:
        ex.meta["solution"] = ex.answer
        ex.answer = _gsm8k_answer(str(ex.answer))
    return examples


def _competition(name: str, folder: str):
    @TASKS.register(name, reward="math", max_new_tokens=512, splits=("test",))
    def task(*, split: str = "test", path: str | None = None,
             instruction: str = "{prompt}\nPut your final answer within \\boxed{{}}.") -> list[Example]:
        _check_split(name, split, ("test",))
        file = _data_file(path, folder, "test.jsonl")
        examples = records_to_examples(read_records(file), prompt_field="problem", answer_field="answer",
                                       template=instruction)
        for ex in examples:
            ex.answer = str(ex.answer)
        return examples

    task.__doc__ = (f"{name}: competition math problems with a reference answer (math-verify reward).\n\n"
                    f"split: 'test', the only split ({folder}/test.jsonl in the shared data); training on it "
                    f"reads the same problems as evaluation, which the run reports\n"
                    "path: a .jsonl file to read instead (fields problem, answer)\n"
                    "instruction: prompt template; {prompt} is the problem")
    return task


math500 = _competition("math500", "math500")
aime24 = _competition("aime24", "aime24")
amc23 = _competition("amc23", "amc23")

from upslope.data import introspection as _introspection, optimization as _optimization, sql as _sql  # noqa: F401,E402

try:  # the HumanEval task lives beside the sandbox
    import upslope.data.humaneval  # noqa: F401
except ModuleNotFoundError as _exc:  # pragma: no cover
    if _exc.name != "upslope.data.humaneval":
        raise

import upslope.data.reasoning_gym  # noqa: E402,F401  (registers the reasoning_gym task; the package loads on use)
