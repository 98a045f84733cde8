"""Streaming with a bin strategy (``bfd``, ``ffd``, ``next_fit``): each buffer packed, its emptiest rows carried.

The stream is read ``buffer_size`` examples at a time. Each buffer (plus the examples carried
from the last one) is packed with the engine; rows that are full enough are emitted (shuffled
within the buffer), and the examples of the emptiest rows are carried into the next buffer::

    buffer 1   [e0 .. e9999]             -> pack -> 1,460 full rows out, 40 examples carried
    buffer 2   [40 carried, e10000 ..]   -> pack -> ...
    end        [carried]                 -> pack -> every row out (flush)

At most ``buffer_size + max(1, buffer_size // 4)`` examples are held, whatever the stream's
length. Efficiency cost of the buffer: rows are packed only within a buffer, so a small buffer
leaves more partly filled rows (``sft`` at 2048: see ``benchmarks/results/pack_dataset.md``
for the measured efficiency per buffer size); carrying the emptiest rows' examples forward
recovers most of it. Cost per buffer: the engine on its lengths, one Arrow ``take`` per
column, and a conversion of the emitted rows to Python lists, a record batch at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

from .._validation import check_not_too_long
from ..engine import PackStats, pack_lengths
from ._arrow_rows import build_rows
from ._columns import read_examples
from ._options import MAX_LENGTH_FIX, PackOptions
from ._row_plan import bin_plan
from ._stream_source import row_dicts

__all__ = ["bin_stream_rows"]

logger = logging.getLogger("packing_collators.offline._streaming")


def _rows_to_carry(row_tokens: np.ndarray, row_sizes: np.ndarray, capacity: int, budget: int) -> np.ndarray:
    """Rows (emptiest first) whose examples go back into the buffer: under 99% full, within ``budget`` examples."""
    slack = max(1, capacity // 100)
    underfull = np.flatnonzero(row_tokens <= capacity - slack)
    underfull = underfull[np.argsort(row_tokens[underfull], kind="stable")]
    fits = np.cumsum(row_sizes[underfull]) <= budget
    return underfull[fits]


def _count(stats: PackStats, result, lengths, new: int, emit, row_tokens, num_carried_in: int) -> None:
    """Add one buffer's numbers: losses and input of its new examples, the rows it emitted."""
    buffer_stats = PackStats.from_result(result, rows=len(emit), packed_tokens=int(row_tokens[emit].sum()))
    buffer_stats.examples = new
    buffer_stats.input_tokens = int(lengths[num_carried_in:].sum())
    buffer_stats.packed_examples = int(np.diff(result.row_offsets)[emit].sum())
    stats.add(buffer_stats)


class _BinPacker:
    """Packs buffer after buffer, carrying the examples of the emptiest rows into the next one."""

    def __init__(self, options: PackOptions, stats: PackStats) -> None:
        self.options, self.stats = options, stats
        self.rng = np.random.default_rng(options.seed)
        self.carried: pa.Table | None = None
        self.seen = 0

    def _checked(self, table: pa.Table) -> pa.Table:
        """``table``'s examples checked (numbered in the whole stream), behind the carried ones."""
        _, lengths = read_examples(table, self.options.keep_columns, first_index=self.seen, stream=True)
        if self.options.overflow == "error":  # no totals: they would be this buffer's only
            check_not_too_long(
                lengths,
                self.options.max_length,
                limit_name="max_length",
                fix=MAX_LENGTH_FIX,
                first_index=self.seen,
                count=False,
            )
        self.seen += len(table)
        return table if self.carried is None else pa.concat_tables([self.carried, table], promote_options="permissive")

    def rows(self, table: pa.Table | None) -> pa.Table:
        """The rows out of the carry plus ``table``; ``None`` is the end of the stream: every row out."""
        final, new = table is None, 0 if table is None else len(table)
        table = self.carried if final else self._checked(table)
        capacity = self.options.max_length
        columns, lengths = read_examples(table, self.options.keep_columns, check_padding=False)
        result = pack_lengths(lengths, capacity, strategy=self.options.strategy, overflow=self.options.overflow)
        row_tokens, row_sizes = result.row_tokens, np.diff(result.row_offsets)
        budget = max(1, self.options.buffer_size // 4)
        carry = np.empty(0, np.int64) if final else _rows_to_carry(row_tokens, row_sizes, capacity, budget)
        emit = np.setdiff1d(np.arange(result.num_rows), carry)
        if self.options.shuffle_rows:
            emit = self.rng.permutation(emit)
        self.carried = table.take(pa.array(bin_plan(result, carry).example)) if len(carry) else None
        _count(self.stats, result, lengths, new, emit, row_tokens, len(table) - new)
        return build_rows(table, bin_plan(result, emit), columns, lengths, label_pad_id=self.options.label_pad_id)


def bin_stream_rows(tables: Iterable[pa.Table], options: PackOptions, stats: PackStats) -> Iterator[dict]:
    """Packed rows (dicts of lists) of a stream of example tables; ``stats`` is filled as it goes."""
    packer = _BinPacker(options, stats)
    for table in tables:
        yield from row_dicts(packer.rows(table))
    if packer.carried is not None:
        yield from row_dicts(packer.rows(None))
        logger.info("pack_dataset (streaming): %s", stats.summary())
