"""A ``datasets.Dataset``'s own Arrow files, read through a memory map this module owns and releases.

``load_from_disk`` (or ``map``) leaves a dataset backed by Arrow stream files; ``datasets``
memory-maps them, and every page a read touches then stays resident, so reading 6.6 GB of
tokens through the dataset grows the process by 6.6 GB. Here each file is mapped with Python's
``mmap``, read zero-copy (``pa.ipc.open_stream`` over the mapping), and the pages of a window
are dropped (``MADV_DONTNEED``; file-backed and read-only, so nothing is lost) once used::

    data-00000-of-00003.arrow   [batch 0 | batch 1 | ... ]   window 0: examples [0, 55k)   read, then released
                                                             window 1: examples [55k, 110k)
    data-00001-of-00003.arrow   [batch 0 | ... ]             window 2: ...

Where an example's first token is in its file (an element index of a numpy view of the file)
is read from the file's own list offsets when a chunk asks (:meth:`ArrowFiles.starts`), through
a few numbers per record batch, so tokens are gathered with one copy per example. Memory:
each example's length (8 bytes), nothing else per example. Cost: one pass over the offsets
and one over the ``attention_mask`` values (the padding check), each window released after use. The files are
used only where they are the dataset exactly: no indices mapping, every block a whole file,
and only column removals, selections and renames replayed on top (:func:`dataset_arrow_files`).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .._compat import apply_replays, dataset_indices
from ._columns import ExampleColumns, read_examples

__all__ = ["ArrowFiles", "Window", "dataset_arrow_files"]

WINDOW_TOKENS = 1 << 22

# Replays that only drop, pick or rename columns: the file's columns are still the dataset's.
_COLUMN_REPLAYS = {"remove_column", "drop", "select", "rename_columns", "replace_schema_metadata", "combine_chunks"}


def _blocks(dataset) -> list | str:
    """The dataset's memory-mapped blocks in row order, or why its files cannot be read directly."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    if dataset_indices(dataset) is not None:
        return "it has an indices mapping (select, shuffle, sort, ...); flatten_indices() removes it"
    table = dataset.data
    rows = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    if any(len(row) != 1 for row in rows):
        return "it concatenates columns of several tables (axis=1)"
    blocks = [row[0] for row in rows]
    if not all(isinstance(block, MemoryMappedTable) for block in blocks):
        return "some of its rows are in memory"
    replayed = {name for block in blocks for name, _, _ in block.replays} - _COLUMN_REPLAYS
    if replayed:
        return f"it replays {sorted(replayed)} on its files"
    return blocks


def dataset_arrow_files(dataset) -> tuple[list[str], dict[str, str]] | str:
    """``(paths, file_column)``: the files that are ``dataset`` row for row, and each column's name in them.

    Or a string saying why the dataset is not its files as they are (read it in memory then).
    """

    blocks = _blocks(dataset)
    if isinstance(blocks, str):
        return blocks
    paths, file_column = [], None
    for block in blocks:
        schema = pa.ipc.open_stream(pa.memory_map(block.path)).schema
        tracer = pa.table({name: [i] for i, name in enumerate(schema.names)})  # which file column is which
        tracer = apply_replays(tracer, block.replays)
        names = {name: schema.names[tracer.column(name)[0].as_py()] for name in tracer.column_names}
        if file_column not in (None, names):
            return "its files name their columns differently"
        if any(schema.field(names[f.name]).type != f.type for f in block.schema):
            return "its columns' types differ from its files'"
        paths.append(block.path)
        file_column = names
    return paths, file_column


@dataclass(frozen=True)
class Window:
    """Examples ``[first, last)``, all in file ``file``: what is read (then released) at once."""

    file: int
    first: int
    last: int


class ArrowFiles:
    """The token columns of a dataset's Arrow files, mapped read-only, with each example's position.

    Attributes:
        lengths: int64 (n,) tokens per example.
        file_first: int64 (files + 1,) the first example of each file, then ``n``.
        windows: consecutive example ranges of about ``WINDOW_TOKENS`` tokens within one file.

    Where an example's tokens are (:meth:`starts`) is read from the files' own list offsets
    when asked, through per-batch bases (a few numbers per record batch): no per-example array.
    """

    def __init__(self, paths: list[str], file_column: dict[str, str], columns: ExampleColumns, *, check: bool = True):
        self.paths, self.file_column, self.columns = paths, file_column, columns
        self._maps = []
        self._batches: list[list[pa.RecordBatch]] = []
        for path in paths:
            with open(path, "rb") as handle:
                self._maps.append(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
            reader = pa.ipc.open_stream(pa.py_buffer(self._maps[-1]))
            self.schema = reader.schema
            self._batches.append(list(reader))
        self._read_offsets(check)

    def _batch_table(self, batch: pa.RecordBatch) -> pa.Table:
        names = [*self.columns.tokens, *self.columns.keep]
        return pa.Table.from_arrays([batch.column(self.file_column[name]) for name in names], names=names)

    def _read_offsets(self, check: bool) -> None:
        """Lengths (one preallocated array: no per-batch pieces left behind in the heap) and per-batch bases."""
        counts = [batch.num_rows for batches in self._batches for batch in batches]
        self.lengths = np.empty(sum(counts), np.int64)
        self._batch_first = np.r_[0, np.cumsum(counts, dtype=np.int64)]
        self._batch_file = np.repeat(np.arange(len(self._batches)), [len(batches) for batches in self._batches])
        # per token column and batch: the element index (in the file's view of the values' dtype) of the
        # values' first element, and the element index (in a view of the offsets' dtype) of the first offset
        self._values_at = {name: np.empty(len(counts), np.int64) for name in self.columns.tokens}
        self._offsets_at = {name: np.empty(len(counts), np.int64) for name in self.columns.tokens}
        self._offsets_dtype: dict[str, np.dtype] = {}
        windows, file_first, b = [], [0], 0
        for f, (batches, mapped) in enumerate(zip(self._batches, self._maps)):
            base, first, tokens = pa.py_buffer(mapped).address, int(self._batch_first[b]), 0
            for batch in batches:
                seen = int(self._batch_first[b])
                table = self._batch_table(batch)
                if check:  # numbered in the whole dataset; the count is of the examples read so far
                    _, batch_lengths = read_examples(table, self.columns, first_index=seen, stream=True)
                for name in self.columns.tokens:
                    column = table.column(name).chunk(0)
                    self._offsets_at[name][b] = self._element_index(column.buffers()[1], base, column.offsets.type)
                    self._offsets_at[name][b] += column.offset
                    self._offsets_dtype[name] = np.dtype(column.offsets.type.to_pandas_dtype())
                    values = column.values
                    self._values_at[name][b] = self._element_index(values.buffers()[1], base, values.type)
                    self._values_at[name][b] += values.offset
                    if name == "input_ids" and not check:
                        batch_lengths = np.diff(column.offsets.to_numpy())
                self.lengths[seen : seen + len(batch)] = batch_lengths
                b += 1
                tokens += int(batch_lengths.sum())
                if tokens >= WINDOW_TOKENS:
                    windows.append(Window(f, first, seen + len(batch)))
                    first, tokens = seen + len(batch), 0
                    self.release(f)  # the padding check read the mask's values
            last = int(self._batch_first[b])
            if last > first:
                windows.append(Window(f, first, last))
            file_first.append(last)
            self.release(f)
        self.file_first = np.array(file_first, np.int64)
        self.windows = windows

    @staticmethod
    def _element_index(buffer: pa.Buffer, base: int, dtype: pa.DataType) -> int:
        start, remainder = divmod(buffer.address - base, dtype.byte_width)
        assert remainder == 0, "Arrow IPC buffers are 8-byte aligned"
        return start

    def starts(self, name: str, examples: np.ndarray) -> np.ndarray:
        """int64: where each example's first token of column ``name`` is in its file's :meth:`view`.

        Reads the examples' list offsets from the mapped files (touching their pages: :meth:`release` after).
        """
        examples = np.asarray(examples, np.int64)
        batch = np.searchsorted(self._batch_first, examples, side="right") - 1
        index = self._offsets_at[name][batch] + (examples - self._batch_first[batch])
        starts = self._values_at[name][batch]
        file = self._batch_file[batch]
        for f in np.unique(file).tolist():
            mapped = self._maps[f]
            dtype = self._offsets_dtype[name]
            offsets = np.frombuffer(mapped, dtype=dtype, count=len(mapped) // dtype.itemsize)
            mine = file == f if len(self._maps) > 1 else slice(None)
            starts[mine] += offsets[index[mine]]
        return starts

    def dtype(self, name: str) -> np.dtype:
        """The numpy dtype of token column ``name``'s values."""
        return np.dtype(self.schema.field(self.file_column[name]).type.value_type.to_pandas_dtype())

    def view(self, file: int, name: str) -> np.ndarray:
        """File ``file`` as a read-only numpy array of column ``name``'s dtype (no copy)."""
        dtype = self.dtype(name)
        return np.frombuffer(self._maps[file], dtype=dtype, count=len(self._maps[file]) // dtype.itemsize)

    def take(self, name: str, examples: np.ndarray) -> pa.Array:
        """Per-example column ``name``'s values of ``examples`` (touches their pages: :meth:`release` after)."""
        chunks = [batch.column(self.file_column[name]) for batches in self._batches for batch in batches]
        column = pa.chunked_array(chunks, type=chunks[0].type) if chunks else pa.chunked_array([], pa.null())
        return column.take(pa.array(examples, pa.int64())).combine_chunks()

    def release(self, file: int | None = None) -> None:
        """Drop the mapped pages of one file (or all) from this process; the page cache keeps them.

        Where there is no ``MADV_DONTNEED`` (Windows) nothing is dropped: the operating system
        evicts clean file-backed pages under memory pressure anyway, so only the RSS reads higher.
        """
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for mapped in self._maps if file is None else [self._maps[file]]:
            if len(mapped):
                mapped.madvise(mmap.MADV_DONTNEED)
