"""Streaming packing: examples in, packed rows out, with memory bounded by a buffer.

The stream is read ``buffer_size`` examples at a time. Each buffer (plus the
examples carried from the last one) is packed with the engine; rows that are
full enough are emitted (shuffled within the buffer), and the examples of the
emptiest rows are carried into the next buffer::

    buffer 1   [e0 .. e9999]             -> pack -> 1,460 full rows out, 40 examples carried
    buffer 2   [40 carried, e10000 ..]   -> pack -> ...
    end        [carried]                 -> pack -> every row out (flush)

At most ``buffer_size + max(1, buffer_size // 4)`` examples are held, whatever the stream's
length. Efficiency cost of the buffer: rows are packed only within a buffer,
so a small buffer leaves more partly filled rows (``sft`` at 2048: see
``benchmarks/results/pack_dataset.md`` for the measured efficiency per buffer
size); carrying the emptiest rows' examples forward recovers most of it.
Cost per buffer: the engine on its lengths, one Arrow ``take`` per column, and
a conversion of the emitted rows to Python lists (what an ``IterableDataset``
yields).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa

from ..engine import PackStats, check_not_too_long, pack_lengths
from ._arrow_rows import build_rows
from ._columns import check_unpadded, example_columns, token_lengths
from ._options import MAX_LENGTH_FIX, PackOptions
from ._row_plan import bin_plan

__all__ = ["pack_stream", "pack_streaming"]

logger = logging.getLogger(__name__)


def _example_tables(source: Any, size: int) -> Iterator[pa.Table]:
    """The stream as Arrow tables of at most ``size`` examples."""
    import datasets

    if isinstance(source, datasets.IterableDataset):
        yield from source.with_format("arrow").iter(batch_size=size)
        return
    iterator = iter(source)
    while batch := list(islice(iterator, size)):
        yield pa.Table.from_pylist(batch)


def _rows_to_carry(row_tokens: np.ndarray, row_sizes: np.ndarray, capacity: int, budget: int) -> np.ndarray:
    """Rows (emptiest first) whose examples go back into the buffer: under 99% full, within ``budget`` examples."""
    slack = max(1, capacity // 100)
    underfull = np.flatnonzero(row_tokens <= capacity - slack)
    underfull = underfull[np.argsort(row_tokens[underfull], kind="stable")]
    fits = np.cumsum(row_sizes[underfull]) <= budget
    return underfull[fits]


def pack_stream(examples: Iterable[pa.Table], options: PackOptions, stats: PackStats) -> Iterator[dict]:
    """Packed rows (dicts of lists) from a stream of example tables; ``stats`` is filled as it goes.

    >>> tables = [pa.table({"input_ids": [[1, 2, 3], [4, 5]]}), pa.table({"input_ids": [[6], [7, 8, 9]]})]
    >>> stats = PackStats("bfd", 4)
    >>> rows = list(pack_stream(tables, PackOptions(max_length=4, shuffle_rows=False), stats))
    >>> [row["input_ids"] for row in rows], [row["seq_lengths"] for row in rows]
    ([[6, 7, 8, 9], [1, 2, 3], [4, 5]], [[1, 3], [3], [2]])
    >>> stats.rows, stats.examples, stats.packed_tokens
    (3, 4, 9)
    """
    if options.strategy == "wrapped":
        raise ValueError("strategy='wrapped' is not supported when streaming; use 'bfd', 'ffd' or 'next_fit'.")
    rng = np.random.default_rng(options.seed)
    capacity = options.max_length
    carried: pa.Table | None = None
    seen = 0
    tables = iter(examples)
    while True:
        table = next(tables, None)
        final = table is None
        if final and carried is None:
            return
        new = 0
        if not final:
            columns = example_columns(table.schema, options.keep_columns)
            lengths = token_lengths(table, columns, first_index=seen)
            check_unpadded(table, first_index=seen, stream=True)
            if options.overflow == "error":
                # numbered in the whole stream, not the buffer; no totals, they would be this buffer's only
                check_not_too_long(
                    lengths, capacity, limit_name="max_length", fix=MAX_LENGTH_FIX, first_index=seen, count=False
                )
            new, seen = len(table), seen + len(table)
            table = table if carried is None else pa.concat_tables([carried, table], promote_options="permissive")
        else:
            table = carried
        columns = example_columns(table.schema, options.keep_columns)
        lengths = token_lengths(table, columns)
        result = pack_lengths(lengths, capacity, strategy=options.strategy, overflow=options.overflow)
        row_tokens, row_sizes = result.row_tokens, np.diff(result.row_offsets)
        carry = (
            np.empty(0, np.int64)
            if final
            else _rows_to_carry(row_tokens, row_sizes, capacity, max(1, options.buffer_size // 4))
        )
        emit = np.setdiff1d(np.arange(result.num_rows), carry)
        if options.shuffle_rows:
            emit = rng.permutation(emit)
        carried = table.take(pa.array(bin_plan(result, carry).order)) if len(carry) else None
        _count(stats, result, lengths, new, emit, row_tokens, len(table) - new)
        yield from build_rows(
            table, bin_plan(result, emit), columns, lengths, label_pad_id=options.label_pad_id
        ).to_pylist()
        if final:
            logger.info("pack_dataset (streaming): %s", stats.summary())
            return


def _count(stats: PackStats, result, lengths, new: int, emit, row_tokens, num_carried_in: int) -> None:
    """Add one buffer's numbers: losses and input of its new examples, the rows it emitted."""
    buffer_stats = PackStats.from_result(result, rows=len(emit), packed_tokens=int(row_tokens[emit].sum()))
    buffer_stats.examples = new
    buffer_stats.input_tokens = int(lengths[num_carried_in:].sum())
    buffer_stats.packed_examples = int(np.diff(result.row_offsets)[emit].sum())
    stats.add(buffer_stats)


def pack_streaming(source: Any, options: PackOptions):
    """``(rows, stats)`` for a stream: an ``IterableDataset`` (dict) for one, else a generator of row dicts."""
    import datasets

    if isinstance(source, datasets.IterableDatasetDict):
        results = {name: pack_streaming(split, options) for name, split in source.items()}
        return datasets.IterableDatasetDict({k: v[0] for k, v in results.items()}), {
            k: v[1] for k, v in results.items()
        }
    stats = PackStats(options.strategy, options.max_length)

    def rows():
        stats.reset()
        yield from pack_stream(_example_tables(source, options.buffer_size), options, stats)

    if isinstance(source, datasets.IterableDataset):
        return datasets.IterableDataset.from_generator(rows), stats
    return rows(), stats
