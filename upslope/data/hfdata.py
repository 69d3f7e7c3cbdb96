"""Hugging Face datasets as sources: a directory saved with `save_to_disk`, a folder of data files whose
names give the splits (`train.jsonl`, `data/test-00000-of-00001.parquet`, as `datasets.load_dataset`
reads a folder), and a Hub id (read with `datasets.load_dataset` where the Hub is reachable).

A split is honoured or refused: asking for a split a directory does not have is one DataError line
listing the splits it has, never a silent read of every file."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Iterator

from upslope.errors import DataError

Records = Iterator[tuple[str, dict[str, Any]]]
FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")  # the data files upslope reads
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_SAVED_MARKERS = ("dataset_dict.json", "state.json")


def looks_like_hub_id(text: str) -> bool:
    """`owner/name` or `name` with no data-file suffix: what a user means as a Hub dataset id."""
    return bool(_HUB_ID.match(text)) and not text.lower().endswith(FILE_SUFFIXES) and text not in (".", "..")


def directory_splits(p: Path) -> dict[str, list[Path]]:
    """Split name -> the data files of a folder that `datasets.load_dataset` would put in that split
    (file or folder names containing train/test/validation/...; a folder with none: all in 'train').
    Files of a format upslope does not read are left out; a saved dataset's splits have no files."""
    if any((p / m).is_file() for m in _SAVED_MARKERS):
        return _saved_splits(p)
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        found = DataFilesDict.from_patterns(get_data_patterns(str(p)), base_path=str(p))
    except FileNotFoundError:  # datasets' "no data files here" errors are FileNotFoundErrors
        return {}
    out = {}
    for split, files in found.items():
        readable = sorted(Path(f) for f in files if str(f).lower().endswith(FILE_SUFFIXES))
        if readable:
            out[str(split)] = readable
    return out


def _saved_splits(p: Path) -> dict[str, list[Path]]:
    """The splits of a `save_to_disk` directory (one unnamed split for a single Dataset)."""
    import json

    if (p / "dataset_dict.json").is_file():
        try:
            return {s: [] for s in json.loads((p / "dataset_dict.json").read_text())["splits"]}
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{p / 'dataset_dict.json'}: not a saved DatasetDict (no 'splits' list)") from None
    return {"": []}


def read_directory(p: Path, split: str | None, read_file: Callable[[Path], Records]) -> Records:
    """Records of a saved dataset or a folder of split files (each read with `read_file`): `split`, or
    'train' when there is one, or the folder's only split; a split the folder lacks, or several splits
    and none asked for, is an error."""
    splits = directory_splits(p)
    if not splits:
        raise DataError(f"{p}: not a saved HF dataset and holds no .jsonl/.json/.csv/.parquet files")
    saved = any((p / m).is_file() for m in _SAVED_MARKERS)
    if list(splits) == [""]:  # a saved single Dataset: it has no named splits
        if split:
            raise DataError(f"{p}: a saved dataset with no splits; data.split={split!r} cannot be honoured "
                            f"(leave data.split unset)")
        yield from _read_saved(p, None)
        return
    if split is None:
        split = "train" if "train" in splits else (next(iter(splits)) if len(splits) == 1 else None)
        if split is None:
            raise DataError(f"{p}: has splits {', '.join(splits)} and none is 'train'; pick one with data.split")
    if split not in splits:
        raise DataError(f"{p}: no split '{split}' (has: {', '.join(splits)})" +
                        ("" if saved else "; a file's or folder's name gives its split, e.g. test.jsonl "
                                          "or data/test-00000.parquet"))
    if saved:
        yield from _read_saved(p, split)
        return
    for f in splits[split]:
        yield from read_file(f)


def _read_saved(p: Path, split: str | None) -> Records:
    import datasets

    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as exc:  # a damaged save: whatever datasets raised, as one line
        raise DataError(f"{p}: cannot load the saved dataset ({type(exc).__name__}: {exc})") from None
    if split is not None:
        ds = ds[split]
    for i, rec in enumerate(ds):
        yield f"{p}[{split or 'data'}]:row {i + 1}", rec


def read_hub(name: str, split: str | None, subset: str | None) -> Records:
    """Records of a Hugging Face Hub dataset, streamed; an unreachable Hub or an unknown id or split is
    one DataError line (checked with one quick request before `load_dataset`, which retries for long)."""
    import datasets
    import huggingface_hub

    where = f"data.path={name}"
    try:
        huggingface_hub.HfApi().dataset_info(name, timeout=10)
    except Exception as exc:
        raise DataError(f"{where}: no such local file or directory, and the Hugging Face Hub could not be "
                        f"asked for dataset '{name}' ({type(exc).__name__}: {_first_line(exc)}); download it "
                        f"where the Hub is reachable and point data.path at the files") from None
    try:
        ds = datasets.load_dataset(name, subset, split=split or "train", streaming=True)
        for i, rec in enumerate(ds):
            yield f"{name}[{split or 'train'}]:row {i + 1}", rec
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever datasets or the Hub raised (no such split, config, file): one line
        raise DataError(f"{where}: {type(exc).__name__}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]
