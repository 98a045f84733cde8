"""The command line's DATA argument: open it as a ``datasets.Dataset``, pick its column, count tokens.

DATA may be::

    a save_to_disk folder         load_from_disk (a DatasetDict: --split picks one, default "train")
    a folder of data files        load_dataset(folder)
    data.parquet, data.arrow      read with pyarrow (the .arrow file memory-mapped), no cache written
    data.json(l), data.csv        load_dataset("json" or "csv", data_files=...)
    owner/name                    load_dataset(name) from the Hugging Face Hub

The column (``--column``; by default the first of ``input_ids``, ``messages``, ``prompt`` and
``completion``, ``text``)::

    list of integers   token ids     lengths read from the Arrow offsets (lengths_from_dataset)
    integer            lengths       read as they are (the fast path: 1M examples in milliseconds)
    string             text          tokenized with --tokenizer
    list of structs    messages      chat messages, tokenized with the tokenizer's chat template
    prompt/completion  prompt_completion   instruction pairs (strings or messages), the same way

``pack`` tokenizes chat data with :func:`tokenize_chat`, so the packed rows carry ``labels``
that train only the assistant's tokens; ``analyze`` only counts the rendered tokens.

Tokenizing is a batched ``Dataset.map`` over ``num_proc`` processes with a progress bar,
kept in memory (nothing is written next to the user's data). Every problem is a
``ValueError``/``TypeError``/``FileNotFoundError`` whose message is one line naming the fix:
data with no examples, and a .json/.jsonl/.csv file that does not parse (a .jsonl file's
first bad line is named). Those files are read without ``datasets``' progress bar and logs,
which would turn the one-line error into several.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..chat import PROMPT_COMPLETION, conversation_of, render_chats, tokenize_chat
from ..offline import is_per_token
from ..sampler import lengths_from_dataset

__all__ = [
    "ColumnKind",
    "choose_column",
    "column_kind",
    "example_lengths",
    "load_tokenizer",
    "open_dataset",
    "packable_columns",
    "token_ids",
    "without_columns",
]

ColumnKind = Literal["tokens", "lengths", "text", "messages", "prompt_completion"]
AUTO_COLUMNS = ("input_ids", "messages", "text")
FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}
PARALLEL_FROM = 10_000  # examples; below this, one process tokenizes faster than starting more


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


def column_kind(dataset: Any, column: str) -> ColumnKind:
    """What ``column`` holds: token ids, lengths, text or messages; a TypeError for anything else.

    >>> from datasets import Dataset
    >>> data = Dataset.from_dict({"input_ids": [[1, 2]], "length": [2], "text": ["a b"], "score": [[0.5, 1.0]]})
    >>> [column_kind(data, name) for name in ("input_ids", "length", "text")]
    ['tokens', 'lengths', 'text']
    >>> column_kind(data, "score")
    Traceback (most recent call last):
    ...
    TypeError: Column 'score' holds list<item: double>, not token data: it must hold token ids (a list of integers per example) or lengths (one integer per example), or be text or messages to tokenize with --tokenizer.
    """
    import pyarrow as pa

    kind = dataset.data.schema.field(column).type
    if pa.types.is_integer(kind):
        return "lengths"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        value = kind.value_type
        if pa.types.is_integer(value):
            return "tokens"
        if pa.types.is_struct(value) and value.get_field_index("content") >= 0:
            return "messages"
        if getattr(value, "extension_name", None) == "arrow.json":  # datasets' Json: messages of differing keys
            return "messages"  # each message is checked as it is tokenized
        if pa.types.is_struct(value) and value.get_field_index("role") >= 0:
            keys = [value.field(i).name for i in range(value.num_fields)]
            raise ValueError(
                f"Column {column!r} holds messages with no 'content' (their keys: {keys}, from example 0 on); each "
                "message needs 'role' and 'content', e.g. {'role': 'user', 'content': 'hi'}: rename the key first."
            )
    raise TypeError(
        f"Column {column!r} holds {kind}, not token data: it must hold token ids (a list of integers per example) "
        "or lengths (one integer per example), or be text or messages to tokenize with --tokenizer."
    )


def choose_column(dataset: Any, column: str | None = None) -> tuple[str, ColumnKind]:
    """``(column, kind)``: the named column, or the first of ``input_ids``, ``messages``, prompt/completion, ``text``.

    Prompt/completion data is named by its ``prompt`` column, of kind ``prompt_completion``.

    >>> from datasets import Dataset
    >>> choose_column(Dataset.from_dict({"text": ["a b"], "input_ids": [[1, 2]]}))
    ('input_ids', 'tokens')
    >>> choose_column(Dataset.from_dict({"prompt": ["2 + 2?"], "completion": ["4."]}))
    ('prompt', 'prompt_completion')
    >>> choose_column(Dataset.from_dict({"text": ["a b"]}), "labels")
    Traceback (most recent call last):
    ...
    ValueError: The dataset has no column 'labels' (its columns: ['text']); pass --column with one of them.
    """
    names = list(dataset.column_names)
    if column is None:
        column = next((name for name in AUTO_COLUMNS[:2] if name in names), None)
        if column is None and set(PROMPT_COMPLETION) <= set(names):
            return "prompt", "prompt_completion"
        column = column or ("text" if "text" in names else None)
        if column is None:
            raise ValueError(
                f"The dataset has none of the columns {list(AUTO_COLUMNS)} nor both 'prompt' and 'completion' "
                f"(its columns: {names}); pass --column with the one holding token ids, lengths, text or messages."
            )
    elif column not in names:
        raise ValueError(
            f"The dataset has no column {column!r} (its columns: {names}); pass --column with one of them."
        )
    return column, column_kind(dataset, column)


def load_tokenizer(name: str):
    """``AutoTokenizer.from_pretrained(name)`` (a local folder or a Hub name), or a one-line error naming ``name``.

    >>> load_tokenizer("./no-such-tokenizer")
    Traceback (most recent call last):
    ...
    FileNotFoundError: --tokenizer './no-such-tokenizer' does not exist: no such folder (a Hub tokenizer is named like 'owner/name').
    """
    if not Path(name).expanduser().exists() and _looks_like_path(name):
        raise FileNotFoundError(
            f"--tokenizer {name!r} does not exist: no such folder (a Hub tokenizer is named like 'owner/name')."
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--tokenizer {name!r} could not be loaded ({' '.join(str(error).split())}); pass a folder saved with "
            "save_pretrained, or a Hub name."
        ) from None


def _needs_tokenizer(column: str, kind: str, tokenizer: Any) -> None:
    if tokenizer is None:
        raise ValueError(
            f"Column {column!r} holds {kind}; pass --tokenizer NAME_OR_PATH to count its tokens "
            "(or --column with token ids or lengths)."
        )
    if kind in ("messages", "prompt_completion") and not getattr(tokenizer, "chat_template", None):
        what = "chat messages" if kind == "messages" else "prompts and completions"
        raise ValueError(
            f"Column {column!r} holds {what}, but the tokenizer has no chat template; "
            "pass --tokenizer with a chat model's tokenizer, or --column with text or token ids."
        )


class _Tokenize:
    """A picklable batched map function: text, messages or prompt/completion in, ``input_ids`` (or their lengths) out."""

    def __init__(self, tokenizer: Any, column: str, kind: str, output: str) -> None:
        self.tokenizer, self.column, self.kind, self.output = tokenizer, column, kind, output

    def __call__(self, batch: dict, indices: list[int]) -> dict:
        values = batch[self.column]
        if self.kind == "prompt_completion":  # rendered as tokenize_chat renders it: prompt turns, then completion
            pairs = zip(batch["prompt"], batch["completion"])
            values = [conversation_of(pair, PROMPT_COMPLETION, i)[0] for i, pair in zip(indices, pairs)]
        elif self.kind == "messages":  # checked as tokenize_chat checks them: a message without content is refused
            values = [conversation_of([value], (self.column,), i)[0] for i, value in zip(indices, values)]
        if self.kind in ("messages", "prompt_completion"):  # a template error names its example, as in pack
            texts = render_chats(self.tokenizer, values, indices, generation_prompt=False)
            ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        else:
            ids = self.tokenizer(values, return_attention_mask=False)["input_ids"]
        return {self.output: [len(x) for x in ids] if self.output == "length" else ids}


def _default_num_proc(dataset, num_proc: int | None) -> int | None:
    if num_proc is None:
        num_proc = min(os.cpu_count() or 1, 8) if len(dataset) >= PARALLEL_FROM else None
    return num_proc if num_proc and num_proc > 1 else None


def _map_tokens(dataset, column, kind, tokenizer, num_proc, output, remove):
    num_proc = _default_num_proc(dataset, num_proc)
    return dataset.map(
        _Tokenize(tokenizer, column, kind, output),
        batched=True,
        with_indices=True,
        num_proc=num_proc,
        remove_columns=remove,
        keep_in_memory=True,
        desc=f"Tokenizing {column!r}",
    )


def example_lengths(
    dataset: Any, *, column: str | None = None, tokenizer: Any = None, num_proc: int | None = None
) -> tuple[np.ndarray, str, ColumnKind]:
    """``(lengths, column, kind)``: int64 (n,) tokens of each example, and where they came from.

    Token ids and lengths are read from Arrow; text and chat data are tokenized (all
    columns but the lengths are dropped from the map's output, so only they are kept).

    >>> from datasets import Dataset
    >>> lengths, column, kind = example_lengths(Dataset.from_dict({"input_ids": [[1, 2, 3], [4]]}))
    >>> lengths.tolist(), column, kind
    ([3, 1], 'input_ids', 'tokens')
    """
    column, kind = choose_column(dataset, column)
    if kind in ("text", "messages", "prompt_completion"):
        _needs_tokenizer(column, kind, tokenizer)
        dataset = _map_tokens(dataset, column, kind, tokenizer, num_proc, "length", dataset.column_names)
        return lengths_from_dataset(dataset, "length"), column, kind
    return lengths_from_dataset(dataset, column), column, kind


def token_ids(dataset: Any, *, column: str | None = None, tokenizer: Any = None, num_proc: int | None = None):
    """The dataset with its tokens in ``input_ids`` (what ``pack_dataset`` packs), tokenizing text or chat data.

    A text column is replaced by ``input_ids``; chat data (messages, or prompt and completion)
    by ``input_ids`` and ``labels`` from :func:`tokenize_chat`: only the assistant's tokens are
    trained, and conversations with nothing to train are left out (logged). A token-id column
    of another name is renamed to ``input_ids``.

    >>> from datasets import Dataset
    >>> token_ids(Dataset.from_dict({"tokens": [[1, 2, 3]]}), column="tokens")[0]
    {'input_ids': [1, 2, 3]}
    """
    column, kind = choose_column(dataset, column)
    if kind == "lengths":
        raise ValueError(
            f"Column {column!r} holds lengths only; packing needs the token ids: pass --column with a "
            "token-id column, or text/messages with --tokenizer."
        )
    if kind in ("text", "messages", "prompt_completion"):
        _needs_tokenizer(column, kind, tokenizer)
        if "input_ids" in dataset.column_names:
            raise ValueError(
                f"The dataset has both {column!r} and 'input_ids'; pass --column input_ids to pack the token ids it has."
            )
        if kind == "text":
            return _map_tokens(dataset, column, kind, tokenizer, num_proc, "input_ids", [column])
        return tokenize_chat(
            dataset,
            tokenizer,
            column=column if kind == "messages" else None,
            num_proc=_default_num_proc(dataset, num_proc),
            keep_in_memory=True,
        )
    if column != "input_ids":
        if "input_ids" in dataset.column_names:
            raise ValueError(f"The dataset has both {column!r} and 'input_ids'; pack 'input_ids' or remove it first.")
        dataset = dataset.rename_column(column, "input_ids")
    return dataset


def without_columns(dataset: Any, remove_columns=()):
    """The dataset without ``remove_columns`` (``--remove-column``), each of which it must have.

    ``pack`` removes them before tokenizing, so a column that tokenizing would write (``labels``
    beside ``messages``) can be removed as the error about it says.

    >>> from datasets import Dataset
    >>> without_columns(Dataset.from_dict({"input_ids": [[1, 2]], "id": [7]}), ["id"]).column_names
    ['input_ids']
    """
    unknown = [name for name in remove_columns if name not in dataset.column_names]
    if unknown:
        raise ValueError(
            f"The dataset has no column(s) {unknown} (its columns: {list(dataset.column_names)}); check --remove-column."
        )
    return dataset.remove_columns(list(remove_columns)) if remove_columns else dataset


def packable_columns(dataset: Any, *, keep_columns=(), remove_columns=()):
    """The dataset without ``remove_columns``, once every other column can go into packed rows.

    A column goes into packed rows if it is per token (a list of numbers, concatenated) or
    kept (``--keep-column``: one value per example, as a list per row). All the others are
    named in one error, with both fixes.

    >>> from datasets import Dataset
    >>> data = Dataset.from_dict({"input_ids": [[1, 2]], "id": [7], "source": ["web"]})
    >>> packable_columns(data, keep_columns=["source"], remove_columns=["id"]).column_names
    ['input_ids', 'source']
    >>> packable_columns(data)
    Traceback (most recent call last):
    ...
    ValueError: Columns ['id', 'source'] are not per-token, so they cannot be concatenated into packed rows; pass --keep-column NAME to keep one as a list per row (one value per example), or --remove-column NAME to leave it out.
    """
    names = list(dataset.column_names)
    unknown = [name for name in [*keep_columns, *remove_columns] if name not in names]
    if unknown:
        raise ValueError(
            f"The dataset has no column(s) {unknown} (its columns: {names}); check --keep-column and --remove-column."
        )
    dataset = without_columns(dataset, remove_columns)
    schema = dataset.data.schema
    refused = [n for n in dataset.column_names if n not in keep_columns and not is_per_token(schema.field(n).type)]
    if refused:
        raise ValueError(
            f"Columns {refused} are not per-token, so they cannot be concatenated into packed rows; pass "
            "--keep-column NAME to keep one as a list per row (one value per example), or --remove-column NAME "
            "to leave it out."
        )
    return dataset
