"""The command line's DATA argument opened as a ``datasets.Dataset``, or a one-line error naming the fix.

DATA may be::

    a save_to_disk folder         load_from_disk (a DatasetDict: --split picks one, default "train")
    a folder of data files        load_dataset(folder)
    data.parquet, data.arrow      read with pyarrow (the .arrow file memory-mapped), no cache written
    data.json(l), data.csv        load_dataset("json" or "csv", data_files=...)
    owner/name                    load_dataset(name) from the Hugging Face Hub

Data with no examples, and a .json/.jsonl/.csv file that does not parse (a .jsonl file's first bad
line is named), are a ``ValueError``; a path that is not there a ``FileNotFoundError``. Those files
are read without ``datasets``' progress bar and logs, which would turn the one-line error into
several. Cost: opening the data (Arrow memory-mapped; a text file parsed once by ``datasets``).
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["FILE_BUILDERS", "open_dataset"]

FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def _looks_like_path(data: str) -> bool:
    """A DATA that cannot be a Hub name (``owner/name``): a file suffix, a path prefix, or deeper nesting."""
    return (
        Path(data).suffix.lower() in FILE_BUILDERS
        or data.startswith((".", "/", "~"))
        or data.count("/") > 1
        or os.sep in data.replace("/", "")
    )


def _pick_split(splits: Any, split: str | None, data: str):
    """``(name, dataset)``: one split of a DatasetDict: ``split``, else its only split, else ``"train"``."""
    names = list(splits)
    if split is not None:
        if split not in splits:
            raise ValueError(f"{data!r} has no split {split!r} (its splits: {names}); pass --split with one of them.")
        return split, splits[split]
    if len(names) == 1:
        return names[0], splits[names[0]]
    if "train" in splits:
        return "train", splits["train"]
    raise ValueError(f"{data!r} has several splits {names} and none is 'train'; pass --split with one of them.")


def open_dataset(data: str, *, split: str | None = None):
    """DATA as a ``datasets.Dataset`` (one split), or a one-line error that says what is wrong.

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> path = os.path.join(tempfile.mkdtemp(), "lengths.parquet")
    >>> pq.write_table(pa.table({"length": [3, 1, 2]}), path)
    >>> open_dataset(path).to_dict()
    {'length': [3, 1, 2]}
    >>> open_dataset("no/such/file.jsonl")
    Traceback (most recent call last):
    ...
    FileNotFoundError: DATA 'no/such/file.jsonl' does not exist: no such file or folder (a Hub dataset is named like 'owner/name').
    >>> bad = os.path.join(tempfile.mkdtemp(), "bad.jsonl")
    >>> with open(bad, "w") as file:
    ...     _ = file.write('{"input_ids": [1, 2]}\\n{"input_ids": [3, 4\\n')
    >>> open_dataset(bad)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: DATA '...bad.jsonl' is not valid JSON lines: line 2 is not a JSON object (Expecting ',' delimiter at column 20): '{"input_ids": [3, 4'. Fix or remove that line: each line must be one JSON object, e.g. {"input_ids": [1, 2, 3]}.
    """
    import datasets

    path = Path(data).expanduser()
    if not path.exists():
        if _looks_like_path(data):
            raise FileNotFoundError(
                f"DATA {data!r} does not exist: no such file or folder (a Hub dataset is named like 'owner/name')."
            )
        loaded = datasets.load_dataset(data, split=split)
    elif path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(str(path))
    else:
        loaded = _open_file(path, data)
    name = None
    if isinstance(loaded, (datasets.DatasetDict, dict)):
        name, loaded = _pick_split(loaded, split, data)
    if len(loaded) == 0:
        where = f"DATA {data!r}" if name is None else f"Split {name!r} of DATA {data!r}"
        other = "" if name is None else "pass --split with another split, or "
        raise ValueError(f"{where} has no examples (0 rows); {other}pass data with at least one example.")
    return loaded


def _open_file(path: Path, data: str):
    import datasets

    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(
            f"DATA {data!r} is not a file type this command reads; use a save_to_disk folder or a "
            f"{', '.join(sorted(FILE_BUILDERS))} file."
        )
    if builder == "arrow":
        return datasets.Dataset.from_file(str(path))  # memory-mapped, as save_to_disk wrote it
    if builder == "parquet":
        import pyarrow.parquet as pq
        from datasets.table import InMemoryTable

        stat = path.stat()  # a fingerprint from the file, so datasets does not hash the whole table
        fingerprint = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        return datasets.Dataset(InMemoryTable(pq.read_table(path)), fingerprint=fingerprint)
    return _load_text_file(builder, path, data)


@contextmanager
def _datasets_quiet():
    """No progress bars and no logs (below CRITICAL) from ``datasets`` inside the block."""
    import datasets

    bars_were_off, verbosity = datasets.utils.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


def _is_blank(path: Path) -> bool:
    """Whether the file holds nothing but whitespace (one read of 1 MiB for any file that holds data)."""
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            if chunk.strip():
                return False
    return True


def _load_text_file(builder: str, path: Path, data: str):
    """A .json/.jsonl/.csv file as a Dataset (``load_dataset``'s steps), or a one-line error: empty, no rows, unparsable."""
    import datasets
    from datasets.utils.info_utils import is_small_dataset

    if _is_blank(path):
        raise ValueError(f"DATA {data!r} has no examples: the file is empty; pass a file with at least one example.")
    try:
        with _datasets_quiet():
            loader = datasets.load_dataset_builder(builder, data_files=str(path))
            loader.download_and_prepare()
            split = loader.info.splits.get("train")
            if split is None or not split.num_examples:  # as_dataset would fail with "Instruction ... no data"
                raise ValueError(f"DATA {data!r} has no examples (0 rows); pass a file with at least one example.")
            return loader.as_dataset(split="train", in_memory=is_small_dataset(loader.info.dataset_size))
    except datasets.exceptions.DatasetGenerationError as error:
        raise ValueError(_unreadable(builder, path, data, error)) from None


def _unreadable(builder: str, path: Path, data: str, error: BaseException) -> str:
    """The one-line message for a file ``datasets`` could not parse: a .jsonl file's first bad line, else the parser's error."""
    if path.suffix.lower() == ".jsonl":
        bad = _first_bad_json_line(path)
        if bad is not None:
            number, reason, line = bad
            shown = line if len(line) <= 60 else line[:57] + "..."
            return (
                f"DATA {data!r} is not valid JSON lines: line {number} is not a JSON object ({reason}): {shown!r}. "
                'Fix or remove that line: each line must be one JSON object, e.g. {"input_ids": [1, 2, 3]}.'
            )
    while error.__cause__ is not None:  # datasets wraps the parser's error: name that one
        error = error.__cause__
    reason = " ".join(str(error).split()) or type(error).__name__
    kind = "CSV" if builder == "csv" else "JSON"
    return f"DATA {data!r} could not be read as {kind} ({reason}); fix the file, or write the examples as .parquet instead."


_JSON_KINDS = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _first_bad_json_line(path: Path) -> tuple[int, str, str] | None:
    """``(line number, why, line)`` of the first non-blank line that is not a JSON object, or None (read on errors only)."""
    with open(path, encoding="utf-8", errors="replace") as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                return number, f"{error.msg} at column {error.colno}", line
            if not isinstance(value, dict):
                return number, f"it is {_JSON_KINDS.get(type(value), 'not an object')}", line
    return None
