"""Prompt sources: JSONL, JSON arrays, CSV, Parquet, Hugging Face dataset directories (saved with
`save_to_disk`, or folders of data files split by name) and Hub ids, mapped to Examples.

Errors name the file and line (JSONL, JSON item) or row (Parquet/CSV/HF) and the missing field.
A field name may be a dotted path into nested records (`reward_model.ground_truth`).
"""
from __future__ import annotations

import codecs
import gzip
import json
from pathlib import Path
from typing import Any, Iterator

from upslope.data.hfdata import looks_like_hub_id, read_directory, read_hub
from upslope.data.types import Example
from upslope.errors import DataError
from upslope.fsutil import check_regular_file


def read_records(path: str | Path, split: str | None = None,
                 subset: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, record) pairs from a .jsonl[.gz], .json (JSON lines or one array of objects), .csv or
    .parquet file, a dataset directory, or a Hugging Face Hub dataset id (`subset`: its configuration)."""
    p = Path(path).expanduser()
    if not p.exists():
        if looks_like_hub_id(str(path)):
            yield from read_hub(str(path), split, subset)
            return
        raise DataError(f"{p}: data file not found")
    name = p.name.lower()
    if p.is_dir():
        yield from read_directory(p, split, read_records)
        return
    check_regular_file(p, "data file", DataError)
    if name.endswith((".jsonl", ".jsonl.gz")):
        yield from _read_jsonl(p)
    elif name.endswith(".json"):
        yield from (_read_json_array(p) if _opens_array(p) else _read_jsonl(p))
    elif name.endswith(".parquet"):
        yield from _read_parquet(p)
    elif name.endswith(".csv"):
        yield from _read_csv(p)
    else:
        raise DataError(f"{p}: unknown data format (expected .jsonl, .jsonl.gz, .json, .csv, .parquet, a dataset "
                        f"directory or a Hugging Face Hub id)")


def _opens_array(p: Path) -> bool:
    """Does the file's first non-blank character open a JSON array (a .json file of one list of rows)?"""
    with open(p, "rb") as fh:
        head = fh.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
    return head.startswith(b"[")


def _read_json_array(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The objects of a file holding one JSON array; a bad item is one DataError naming file and item."""
    try:
        rows = json.loads(p.read_bytes().removeprefix(codecs.BOM_UTF8).decode("utf-8"),
                          object_pairs_hook=_distinct_keys)
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                        f"expected a UTF-8 JSON array of objects") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{p}: unusable JSON ({_json_problem(exc)})") from None
    for i, rec in enumerate(rows, 1):
        if not isinstance(rec, dict):
            raise DataError(f"{p}: item {i}: expected a JSON object, got {type(rec).__name__}")
        yield f"{p}:item {i}", rec


def _read_csv(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of a CSV file with a header line, each column's type inferred (numbers stay numbers)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        table = pcsv.read_csv(p)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{p}: not a valid CSV file ({str(exc).splitlines()[0][:160]})") from None
    for i, rec in enumerate(_batched_rows(table.to_batches()), 1):
        yield f"{p}:row {i}", rec


def _batched_rows(batches: Any) -> Iterator[dict[str, Any]]:
    """Rows of Arrow record batches, one batch in Python objects at a time."""
    for batch in batches:
        yield from batch.to_pylist()


def _read_parquet(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of a Parquet file, read a batch at a time (a large file is never one Python list)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(p).iter_batches(batch_size=4096)
        for i, rec in enumerate(_batched_rows(batches), 1):
            yield f"{p}:row {i}", rec
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{p}: not a valid Parquet file ({str(exc).splitlines()[0][:160]})") from None


def _read_jsonl(p: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records of a JSON-lines file (gzipped when it ends in .gz); a binary, non-UTF-8 or damaged
    file is one DataError line naming the file and line."""
    import zlib

    lineno = 0
    try:
        with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as fh:
            for lineno, raw in enumerate(fh, 1):
                rec = _jsonl_record(p, lineno, raw)
                if rec is not None:
                    yield f"{p}:{lineno}", rec
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataError(f"{p}: not a valid gzip file (at line {lineno + 1}: {exc})") from None


def _jsonl_record(p: Path, lineno: int, raw: bytes) -> dict[str, Any] | None:
    """One line's JSON object (None for a blank line), or a DataError naming file:line. A byte-order
    mark opening the file is skipped (editors on Windows write one)."""
    if lineno == 1:
        raw = raw.removeprefix(codecs.BOM_UTF8)
    if b"\x00" in raw:
        raise DataError(f"{p}:{lineno}: binary data (a NUL byte); expected UTF-8 JSON lines")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                        f"expected UTF-8 JSON lines") from None
    if not line.strip():
        return None
    try:
        rec = json.loads(line, object_pairs_hook=_distinct_keys)
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # a key twice, a number over 4300 digits, nesting too deep
        raise DataError(f"{p}:{lineno}: unusable JSON ({_json_problem(exc)})") from None
    if not isinstance(rec, dict):
        raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(rec).__name__}")
    if "\\u" in line and _has_lone_surrogate(rec):
        raise DataError(f"{p}:{lineno}: a \\ud800-\\udfff escape that is half of a character (a lone UTF-16 "
                        f"surrogate); expected text that is valid Unicode")
    return rec


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct (json keeps the last of two, silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key '{key}' appears twice in one object; keep one")
        out[key] = value
    return out


def _json_problem(exc: BaseException) -> str:
    """What json refused besides syntax, in a few words."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    return "an integer of over 4300 digits" if "integer string conversion" in text else text


def _has_lone_surrogate(value: Any) -> bool:
    """A string inside `value` that cannot be UTF-8 (json decodes a lone \\ud800 escape into one)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def require_field(rec: dict[str, Any], name: str, where: str, option: str, hint: str = "") -> Any:
    """rec[name] (a dotted name reads nested records: `reward_model.ground_truth`), or one DataError line
    naming the file/line, the field, the option that names it and the fields the record does have."""
    found, value, inside = lookup(rec, name)
    if not found:
        fields = ", ".join(inside) if inside is not None else ", ".join(rec)
        at = f"; fields of '{name.rpartition('.')[0]}' here" if inside is not None and "." in name else "; fields here"
        raise DataError(f"{where}: field '{name}' missing ({option}{at}: {fields}){hint}")
    return value


def lookup(rec: dict[str, Any], name: str) -> tuple[bool, Any, list[str] | None]:
    """(found, value, keys of the innermost record reached) for a field name: a key of `rec` itself
    first, else a dotted path through nested records."""
    if name in rec:
        return True, rec[name], None
    node: Any = rec
    parts = name.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            return False, None, list(node) if isinstance(node, dict) and i else None
        node = node[part]
    return True, node, None


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")


def require_text(rec: dict[str, Any], name: str, where: str, option: str, hint: str = "",
                 messages_option: str | None = None) -> str:
    """rec[name] as non-empty text, or one DataError line naming the file/line and the field; a list
    there (most likely a chat) names `messages_option`, the option that reads chat messages."""
    value = require_field(rec, name, where, option, hint)
    if isinstance(value, list) and messages_option:
        raise DataError(f"{where}: field '{name}' must be text, got a list (chat messages?): "
                        f"set {messages_option}={name}")
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{name}' must be text, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: field '{name}' is empty")
    return value


def require_messages(rec: dict[str, Any], name: str, where: str,
                     option: str = "data.messages_field") -> list[dict[str, Any]]:
    """rec[name] as a chat: a non-empty list of {role, content} with a known role and text content
    (null content only beside tool_calls), not all of it blank; one DataError line otherwise."""
    msgs = require_field(rec, name, where, option)
    if not isinstance(msgs, list) or not msgs:
        raise DataError(f"{where}: field '{name}' must be a non-empty list of {{role, content}} messages")
    for i, m in enumerate(msgs, 1):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not (
                isinstance(content, str) or (content is None and m.get("tool_calls"))):
            raise DataError(f"{where}: field '{name}' message {i} must be an object with text 'role' and "
                            f"'content', got {str(m)[:80]}")
        if m["role"] not in CHAT_ROLES:
            raise DataError(f"{where}: field '{name}' message {i} has role {m['role']!r}; "
                            f"expected one of {', '.join(CHAT_ROLES)}")
    if not any(isinstance(m["content"], str) and m["content"].strip() for m in msgs):
        raise DataError(f"{where}: field '{name}' has no message with any text")
    return [dict(m) for m in msgs]


def records_to_examples(
    records: Iterator[tuple[str, dict[str, Any]]],
    prompt_field: str = "prompt",
    messages_field: str | None = None,
    answer_field: str | None = "answer",
    template: str = "{prompt}",
    limit: int | None = None,
    option_prefix: str = "data",
) -> list[Example]:
    """Map raw records to Examples; every other field rides along in `meta`. Errors name the options
    under `option_prefix` (the config section the mapping came from: data or eval.data)."""
    out: list[Example] = []
    for where, rec in records:
        if limit is not None and len(out) >= limit:
            break
        if messages_field:
            msgs = require_messages(rec, messages_field, where, f"{option_prefix}.messages_field")
            prompt: Any = msgs[:-1] if msgs[-1]["role"] == "assistant" and len(msgs) > 1 else msgs
        else:
            text = require_text(rec, prompt_field, where, f"{option_prefix}.prompt_field",
                                messages_option=f"{option_prefix}.messages_field")
            prompt = apply_template(template, text, rec, where, f"{option_prefix}.template")
        answer = None
        if answer_field:
            answer = require_field(rec, answer_field, where, f"{option_prefix}.answer_field",
                                   f"; set {option_prefix}.answer_field=null for prompts without answers")
        meta = {k: v for k, v in rec.items() if k not in (prompt_field, messages_field)}
        meta["source"] = where
        out.append(Example(prompt=prompt, answer=answer, meta=meta, id=str(rec.get("id", len(out)))))
    return out


def apply_template(template: str, prompt: str, record: dict[str, Any], where: str,
                   option: str = "data.template") -> str:
    """`template` with {prompt} and the record's fields filled in; a field the record lacks or a
    malformed template is one DataError line naming `where` and `option`."""
    try:
        return template.format(prompt=prompt, **{k: v for k, v in record.items() if k != "prompt"})
    except KeyError as exc:
        fields = ", ".join(["prompt", *(k for k in record if k != "prompt")])
        raise DataError(f"{where}: {option} refers to field {exc} that the record lacks (fields: {fields})") from None
    except (IndexError, ValueError, AttributeError) as exc:
        raise DataError(f"{option}={template!r}: {exc} (use {{prompt}} and record field names in braces)") from None
