"""Writing packed rows as an Arrow table, from a table of examples and a row plan.

Two examples ``[5, 6, 7]`` and ``[8, 9]`` (with labels) packed into one row::

    input_ids     [5,    6, 7, 8,    9]   the examples' dtype (e.g. int32)
    labels        [-100, 6, 7, -100, 9]   first token of each example -100
    position_ids  [0,    1, 2, 0,    1]   int32, restarting per segment
    seq_lengths   [3, 2]                  int32, one per segment
    source        ["web", "math"]         a kept per-example column: one value per segment

Per-token columns are gathered with numpy through one token index per chunk
(built by a cumsum over example jumps, shared by every column), so the cost is
one index plus one gather per column, plus a cumsum for ``position_ids``; no
Python loop over examples or tokens. Kept per-example columns use one Arrow
``take``. Rows are built in chunks of about 16M tokens, so offsets stay int32
and a progress bar can move; ``num_proc`` chunks are built at once in threads
(numpy and Arrow release the GIL).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ..collate import segment_layout
from ._columns import ExampleColumns
from ._row_plan import RowPlan

__all__ = ["build_rows", "CHUNK_TOKENS"]

CHUNK_TOKENS = 1 << 24


def _offsets(boundaries: np.ndarray) -> pa.Array:
    return pa.array((boundaries - boundaries[0]).astype(np.int32))


def _signed(values: np.ndarray) -> np.ndarray:
    """``values`` (a fresh gather, so writable) in a dtype that can hold -100."""
    if np.issubdtype(values.dtype, np.unsignedinteger):
        return values.astype(np.int64)
    return values


class _FlatColumns:
    """Each per-token column's values as one flat numpy array, and where each example starts in them."""

    def __init__(self, table: pa.Table, columns: ExampleColumns, lengths: np.ndarray) -> None:
        self.values = {name: _flat_values(table.column(name)) for name in columns.tokens}
        self.starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64) if len(lengths) else lengths
        self.index_dtype = np.int32 if (int(lengths.sum()) if len(lengths) else 0) < 2**31 else np.int64


def _flat_values(column: pa.ChunkedArray) -> np.ndarray:
    chunks = [chunk.flatten() for chunk in column.chunks]
    if not chunks:
        return np.empty(0, column.type.value_type.to_pandas_dtype())
    values = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
    return values.to_numpy(zero_copy_only=False)


def _token_index(flat: _FlatColumns, examples: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Where each token of ``examples`` (their first ``kept`` tokens, end to end) is in the flat values."""
    total = int(kept.sum())
    steps = np.ones(total, dtype=flat.index_dtype)
    if not total:
        return steps
    sources = flat.starts[examples]
    out_starts = np.r_[0, np.cumsum(kept)[:-1]]
    steps[out_starts[1:]] = sources[1:] - (sources[:-1] + kept[:-1]) + 1
    steps[0] = sources[0]
    return np.cumsum(steps, out=steps)


def _chunk(table, flat: _FlatColumns, plan: RowPlan, columns: ExampleColumns, label_pad_id: int, first: int, last: int):
    """Rows ``first`` to ``last - 1`` as a RecordBatch."""
    row_starts, example_starts = plan.row_starts, plan.example_starts
    begin, end = int(row_starts[first]), int(row_starts[last])
    e0 = int(np.searchsorted(example_starts[1:], begin, side="right"))
    e1 = int(np.searchsorted(example_starts[:-1], end, side="left"))
    base = int(example_starts[e0])
    index = _token_index(flat, plan.order[e0:e1], plan.kept[e0:e1])[begin - base : end - base]
    row_offsets = _offsets(row_starts[first : last + 1])
    s0, s1 = int(plan.row_segments[first]), int(plan.row_segments[last])
    arrays, names = [], []
    for name in columns.tokens:
        values = flat.values[name][index]
        if name == columns.labels:
            values = _signed(values)
            starts = example_starts[e0:e1] - begin
            values[starts[starts >= 0]] = label_pad_id
        arrays.append(pa.ListArray.from_arrays(row_offsets, pa.array(values)))
        names.append(name)
        if name == (columns.labels or "input_ids"):
            positions = segment_layout(plan.segment_lengths[s0:s1]).position_ids(dtype=np.int32)
            arrays.append(pa.ListArray.from_arrays(row_offsets, pa.array(positions)))
            names.append("position_ids")
            segment_offsets = _offsets(plan.row_segments[first : last + 1])
            seq_lengths = pa.array(plan.segment_lengths[s0:s1].astype(np.int32))
            arrays.append(pa.ListArray.from_arrays(segment_offsets, seq_lengths))
            names.append("seq_lengths")
    if columns.keep:
        examples = pa.array(plan.order[plan.segment_example[s0:s1]])
        segment_offsets = _offsets(plan.row_segments[first : last + 1])
        for name in columns.keep:
            taken = table.column(name).take(examples).combine_chunks()
            arrays.append(pa.ListArray.from_arrays(segment_offsets, taken))
            names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _chunk_bounds(plan: RowPlan) -> list[tuple[int, int]]:
    rows_per_chunk = max(1, CHUNK_TOKENS // plan.capacity)
    edges = list(range(0, plan.num_rows, rows_per_chunk)) + [plan.num_rows]
    return list(zip(edges[:-1], edges[1:]))


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
    """The packed rows of ``plan`` over ``table`` (see the module docstring for the columns).

    >>> from packing_collators import pack_lengths
    >>> from packing_collators.offline._columns import example_columns
    >>> from packing_collators.offline._row_plan import bin_plan
    >>> table = pa.table({"input_ids": [[5, 6, 7], [8, 9]], "labels": [[5, 6, 7], [8, 9]]})
    >>> plan = bin_plan(pack_lengths([3, 2], capacity=8))
    >>> rows = build_rows(table, plan, example_columns(table.schema), np.array([3, 2]))
    >>> rows.to_pylist()
    [{'input_ids': [5, 6, 7, 8, 9], 'labels': [-100, 6, 7, -100, 9], 'position_ids': [0, 1, 2, 0, 1], 'seq_lengths': [3, 2]}]
    """
    flat = _FlatColumns(table, columns, lengths)
    bounds = _chunk_bounds(plan)
    if not bounds:
        return pa.Table.from_batches([_chunk(table, flat, plan, columns, label_pad_id, 0, 0)])

    def build(bound):
        return _chunk(table, flat, plan, columns, label_pad_id, *bound)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(bounds), desc=desc, unit="chunk", disable=not progress)
    with bar:
        if num_proc and num_proc > 1 and len(bounds) > 1:
            with ThreadPoolExecutor(max_workers=num_proc) as pool:
                batches = []
                for batch in pool.map(build, bounds):
                    batches.append(batch)
                    bar.update()
        else:
            batches = []
            for bound in bounds:
                batches.append(build(bound))
                bar.update()
    return pa.Table.from_batches(batches)
