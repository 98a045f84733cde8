"""Packed rows as Arrow record batches, from a row plan and each segment's tokens.

Two examples ``[5, 6, 7]`` and ``[8, 9]`` (with labels) packed into one row::

    input_ids     [5,    6, 7, 8,    9]   the examples' dtype (e.g. int32)
    labels        [-100, 6, 7, -100, 9]   first token of each example (or split piece) -100
    position_ids  [0,    1, 2, 0,    1]   int32, restarting per segment
    seq_lengths   [3, 2]                  int32, one per segment
    source        ["web", "math"]         a kept per-example column: one value per segment

Each per-token column's tokens are gathered with one memcpy per segment
(:func:`gather_runs`, an Arrow list-view flattened), plus a cumsum for ``position_ids``; no
Python loop over examples or tokens. Kept per-example columns use one Arrow ``take``.
Rows are built in chunks of about 16M tokens (:func:`chunk_bounds`), so offsets stay int32
and memory stays bounded; ``num_proc`` chunks are built at once in threads (numpy and Arrow release the GIL).
Where the tokens come from is the caller's: an in-memory table here (:class:`TableTokens`),
the dataset's Arrow files in ``_disk_rows``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ..batch import segment_layout
from ._columns import ExampleColumns
from ._row_plan import RowPlan

__all__ = [
    "CHUNK_TOKENS",
    "TableTokens",
    "build_rows",
    "chunk_bounds",
    "gather_runs",
    "row_batches",
    "rows_batch",
]

CHUNK_TOKENS = 1 << 24


def gather_runs(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``values[starts[i] : starts[i] + lengths[i]]`` end to end: one memcpy per run, in Arrow.

    A list-view over ``values`` flattened: no per-token index (faster than ``np.take``);
    the result is fresh (never a view of ``values``, which may be a buffer reused later) and writable.

    >>> gather_runs(np.arange(100, 120), np.array([10, 3, 7]), np.array([2, 3, 1])).tolist()
    [110, 111, 103, 104, 105, 107]
    >>> gather_runs(np.array([True, False, True]), np.array([1, 0]), np.array([2, 1])).tolist()
    [False, True, True]
    >>> values = np.arange(5)
    >>> np.may_share_memory(gather_runs(values, np.array([0, 2]), np.array([2, 3])), values)  # runs end to end
    False
    """
    if values.dtype == np.bool_:  # Arrow packs booleans into bits: copy them as bytes
        return gather_runs(values.view(np.uint8), starts, lengths).view(np.bool_)
    runs = pa.LargeListViewArray.from_arrays(
        pa.array(starts, pa.int64()), pa.array(lengths, pa.int64()), pa.array(values)
    )
    flat = runs.flatten()
    gathered = np.frombuffer(flat.buffers()[1], values.dtype, len(flat), flat.offset * values.itemsize)
    # runs end to end in order come back as a slice of ``values`` itself: copied, so the result is always fresh
    return gathered.copy() if np.may_share_memory(gathered, values) else gathered


def _position_ids(lengths: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """int32 position of each token in its segment (``segment_layout``'s, into ``out`` when given)."""
    if out is None or not len(lengths) or lengths.min() == 0:
        return segment_layout(lengths).position_ids(dtype=np.int32)
    steps = out[: int(lengths.sum())]
    steps.fill(1)
    steps[np.cumsum(lengths[:-1])] = 1 - lengths[:-1]  # back to 0 at each segment's first token
    steps[0] = 0
    return np.cumsum(steps, dtype=np.int32, out=steps)


def _offsets(boundaries: np.ndarray) -> pa.Array:
    return pa.array((boundaries - boundaries[0]).astype(np.int32))


def _signed(values: np.ndarray) -> np.ndarray:
    """``values`` writable (a fresh gather is; an Arrow buffer is copied) in a dtype that can hold -100."""
    if np.issubdtype(values.dtype, np.unsignedinteger):
        return values.astype(np.int64)
    return values if values.flags.writeable else values.copy()


def rows_batch(
    plan: RowPlan,
    tokens: Mapping[str, np.ndarray],
    columns: ExampleColumns,
    label_pad_id: int,
    kept: Mapping[str, pa.Array] | None = None,
    *,
    positions_out: np.ndarray | None = None,
) -> pa.RecordBatch:
    """Every row of ``plan`` as one RecordBatch, given each per-token column's segments end to end.

    ``positions_out``: an int32 buffer (reused chunk after chunk) to write ``position_ids`` into.

    >>> from packing_collators.offline._row_plan import wrapped_plan
    >>> plan = wrapped_plan(np.array([3, 2]), 4, order=np.arange(2))
    >>> tokens = {"input_ids": np.array([5, 6, 7, 8, 9]), "labels": np.array([5, 6, 7, 8, 9])}
    >>> rows_batch(plan, tokens, ExampleColumns(("input_ids", "labels"), "labels", ()), -100).to_pylist()
    [{'input_ids': [5, 6, 7, 8], 'labels': [-100, 6, 7, -100], 'position_ids': [0, 1, 2, 0], 'seq_lengths': [3, 1]}, {'input_ids': [9], 'labels': [9], 'position_ids': [0], 'seq_lengths': [1]}]
    """
    row_offsets = _offsets(plan.row_starts)
    segment_offsets = _offsets(plan.row_offsets)
    arrays, names = [], []
    for name in columns.tokens:
        values = tokens[name]
        if name == columns.labels:
            values = _signed(values)
            values[plan.segment_starts[:-1][plan.restarts]] = label_pad_id
        arrays.append(pa.ListArray.from_arrays(row_offsets, pa.array(values)))
        names.append(name)
        if name == (columns.labels or "input_ids"):
            positions = _position_ids(plan.length, positions_out)
            arrays.append(pa.ListArray.from_arrays(row_offsets, pa.array(positions)))
            seq_lengths = pa.array(plan.length.astype(np.int32))
            arrays.append(pa.ListArray.from_arrays(segment_offsets, seq_lengths))
            names += ["position_ids", "seq_lengths"]
    for name in columns.keep:
        arrays.append(pa.ListArray.from_arrays(segment_offsets, kept[name]))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


class TableTokens:
    """Each per-token column of an in-memory table as one flat numpy array, and where each example starts in it."""

    def __init__(self, table: pa.Table, columns: ExampleColumns, lengths: np.ndarray) -> None:
        self.table = table
        self.values = {name: _flat_values(table.column(name)) for name in columns.tokens}
        self.starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64) if len(lengths) else lengths

    def gather(self, names, plan: RowPlan) -> dict[str, np.ndarray]:
        """The plan's tokens of each column in ``names``, segment after segment (one memcpy per segment)."""
        starts = self.starts[plan.example] + plan.skip
        return {name: gather_runs(self.values[name], starts, plan.length) for name in names}

    def take(self, name: str, examples: np.ndarray) -> pa.Array:
        """Per-example column ``name``'s values of ``examples``."""
        return self.table.column(name).take(pa.array(examples)).combine_chunks()


def _flat_values(column: pa.ChunkedArray) -> np.ndarray:
    chunks = [chunk.flatten() for chunk in column.chunks]
    if not chunks:
        return np.empty(0, column.type.value_type.to_pandas_dtype())
    values = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
    return values.to_numpy(zero_copy_only=False)


def chunk_bounds(plan: RowPlan, chunk_tokens: int | None = None) -> list[tuple[int, int]]:
    """Row ranges ``[first, last)`` of about ``chunk_tokens`` (default ``CHUNK_TOKENS``) tokens each (at least one range).

    >>> from packing_collators.offline._row_plan import wrapped_plan
    >>> chunk_bounds(wrapped_plan(np.array([9, 9]), 4, order=np.arange(2)), chunk_tokens=8)
    [(0, 2), (2, 4), (4, 5)]
    """
    rows_per_chunk = max(1, (chunk_tokens or CHUNK_TOKENS) // plan.capacity)
    edges = list(range(0, plan.num_rows, rows_per_chunk)) + [plan.num_rows]
    return list(zip(edges[:-1], edges[1:])) or [(0, 0)]


def row_batches(
    source: TableTokens, plan: RowPlan, columns: ExampleColumns, *, label_pad_id: int = -100, num_proc: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of ``plan`` over an in-memory table (``source``), one RecordBatch per chunk, in order."""

    def build(bound: tuple[int, int]) -> pa.RecordBatch:
        part = plan.rows(*bound)
        tokens = source.gather(columns.tokens, part)
        kept = {name: source.take(name, part.example) for name in columns.keep}
        return rows_batch(part, tokens, columns, label_pad_id, kept)

    bounds = chunk_bounds(plan)
    if num_proc and num_proc > 1 and len(bounds) > 1:
        with ThreadPoolExecutor(max_workers=num_proc) as pool:
            yield from pool.map(build, bounds)
    else:
        yield from map(build, bounds)


def build_rows(
    table: pa.Table,
    plan: RowPlan,
    columns: ExampleColumns,
    lengths: np.ndarray,
    *,
    label_pad_id: int = -100,
    num_proc: int | None = None,
    progress: bool = False,
    desc: str = "Packing rows",
) -> pa.Table:
    """The packed rows of ``plan`` over ``table`` as one in-memory table (see the module docstring for the columns).

    >>> from packing_collators import pack_lengths
    >>> from packing_collators.offline._columns import example_columns
    >>> from packing_collators.offline._row_plan import bin_plan
    >>> table = pa.table({"input_ids": [[5, 6, 7], [8, 9]], "labels": [[5, 6, 7], [8, 9]]})
    >>> plan = bin_plan(pack_lengths([3, 2], capacity=8))
    >>> rows = build_rows(table, plan, example_columns(table.schema), np.array([3, 2]))
    >>> rows.to_pylist()
    [{'input_ids': [5, 6, 7, 8, 9], 'labels': [-100, 6, 7, -100, 9], 'position_ids': [0, 1, 2, 0, 1], 'seq_lengths': [3, 2]}]
    """
    from tqdm.auto import tqdm

    source = TableTokens(table, columns, lengths)
    batches = row_batches(source, plan, columns, label_pad_id=label_pad_id, num_proc=num_proc)
    done = []
    with tqdm(total=len(chunk_bounds(plan)), desc=desc, unit="chunk", disable=not progress) as bar:
        for batch in batches:
            done.append(batch)
            bar.update()
    return pa.Table.from_batches(done)
