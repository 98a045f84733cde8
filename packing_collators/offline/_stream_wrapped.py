"""Streaming with ``strategy="wrapped"``: each buffer cut into full rows after the unfinished row carried from the last.

Each buffer's examples are concatenated after the unfinished row carried from the last buffer
and cut into full rows; only the unfinished row (fewer than ``max_length`` tokens) is carried.
Examples ``A`` (3 tokens), ``B`` (6), ``C`` (2), ``D`` (1); max_length 4, buffer_size 2::

    buffer 1   A A A B | B B B B | B          -> 2 full rows out, carry: B's last token
    buffer 2   B C C D                        -> 1 full row out, nothing carried
    end        (nothing carried)              -> the carry, if any, is the last, shorter row

Every token comes out once, in stream order when ``shuffle_rows=False`` (then the rows
equal the in-memory ``"wrapped"`` rows of the same examples, for any ``buffer_size``).
With ``shuffle_rows`` the *examples* of each buffer are shuffled (seeded) before they are
concatenated, not the rows after cutting: that is what the in-memory ``"wrapped"`` does (a
buffer as large as the stream gives its very rows), it mixes the examples inside each row
as well as across rows, and it keeps an example's fragments in consecutive rows. Memory: one
buffer of examples plus fewer than ``max_length`` carried tokens (flat from 100k to 1M
``sft`` examples: ``benchmarks/results/streaming.md``). Cost per buffer: one permutation and
a few numpy operations over its examples, one gather per per-token column, the conversion
to Python lists.

A packed ``datasets.IterableDataset`` with ``"wrapped"`` resumes: its ``state_dict()`` holds
the source's state at the start of the current buffer, the carry entering it (under
``max_length`` tokens), the random generator's state and the rows of the buffer already
yielded. ``load_state_dict`` then re-reads that one buffer and continues with the very rows
the uninterrupted run would have yielded, shuffled or not, as long as the source resumes
exactly (a ``datasets`` shuffle buffer does not: its examples are lost on resume).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._compat import BaseExamplesIterable
from ..engine import PackStats
from ._arrow_rows import build_rows
from ._columns import ExampleColumns, read_examples
from ._empty import warn_if_nothing_packed
from ._options import PackOptions
from ._row_plan import wrapped_plan
from ._stream_source import SourceReader, row_dicts

__all__ = ["WrappedExamplesIterable", "wrapped_stream_rows"]

logger = logging.getLogger("packing_collators.offline._streaming")


def _table_bytes(table: pa.Table | None) -> bytes | None:
    if table is None:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _table_from_bytes(data: bytes | None) -> pa.Table | None:
    return None if data is None else pa.ipc.open_stream(pa.py_buffer(data)).read_all()


@dataclasses.dataclass
class _Buffer:
    """One buffer's examples behind the carry: the table, its columns, lengths, and the stream order."""

    table: pa.Table
    columns: ExampleColumns
    lengths: np.ndarray  # int64 (n,), carried examples first
    order: np.ndarray  # int64 (n,), the carried examples first, then the new ones (shuffled)
    new_lengths: np.ndarray  # int64 (new,), the new examples' lengths (for the stats)


class _WrappedPacker:
    """Cuts a stream of example tables into full rows, one buffer at a time, carrying the unfinished row.

    The carry is a small table of the examples of the unfinished row (fewer than ``max_length``
    tokens); its first example may be the tail of an example cut by the last row boundary
    (``carry_continues``): a segment of its own, whose first token keeps its label.
    """

    def __init__(self, options: PackOptions, stats: PackStats) -> None:
        self.options, self.stats = options, stats
        self.rng = np.random.default_rng(options.seed)
        self.seen = 0
        self.carry: pa.Table | None = None
        self.carry_continues = False

    def state(self) -> dict:
        """Everything needed to pack the rest of the stream the same way (small: the carry is under one row)."""
        return {
            "examples_read": self.seen,
            "rng": self.rng.bit_generator.state,
            "carry": _table_bytes(self.carry),
            "carry_continues": self.carry_continues,
            "stats": dataclasses.asdict(self.stats),
        }

    def load_state(self, state: dict) -> None:
        self.seen = state["examples_read"]
        self.rng.bit_generator.state = state["rng"]
        self.carry, self.carry_continues = _table_from_bytes(state["carry"]), state["carry_continues"]
        for name, value in state["stats"].items():
            setattr(self.stats, name, value)

    def _buffer(self, table: pa.Table | None) -> _Buffer:
        carried = 0 if self.carry is None else len(self.carry)
        new_lengths = np.empty(0, np.int64)
        order = np.empty(0, np.int64)
        if table is not None:
            _, new_lengths = read_examples(table, self.options.keep_columns, first_index=self.seen, stream=True)
            self.seen += len(table)
            order = self.rng.permutation(len(table)) if self.options.shuffle_rows else np.arange(len(table))
            if self.carry is not None:
                table = pa.concat_tables([self.carry, table], promote_options="permissive")
        else:
            table = self.carry
        columns, lengths = read_examples(table, self.options.keep_columns, check_padding=False)
        return _Buffer(
            table, columns, lengths, np.r_[np.arange(carried), carried + order].astype(np.int64), new_lengths
        )

    def rows(self, table: pa.Table | None) -> tuple[pa.Table | None, int | None]:
        """The full rows of the carry then ``table`` (None if none), and row 0's first label if it is kept.

        ``table=None`` is the end of the stream: the carry comes out as the last, shorter row.
        """
        if table is None and self.carry is None:
            return None, None
        buffer = self._buffer(table)
        capacity = self.options.max_length
        order = buffer.order[buffer.lengths[buffer.order] > 0]
        ends = np.cumsum(buffer.lengths[order])
        starts = ends - buffer.lengths[order]
        total = int(ends[-1]) if len(ends) else 0
        full = -(-total // capacity) if table is None else total // capacity
        cut = min(total, full * capacity)  # tokens out: rows 0 .. full - 1 of the concatenation
        self._count(buffer, starts, ends, cut, full)
        # the carried tail's label, from before _carry_from replaces the carry; build_rows masks it as an example start
        first_label = self._tail_label(buffer.columns) if self.carry_continues and cut else None
        self._carry_from(buffer.table, buffer.columns, order, starts, ends, cut)
        if not full:
            return None, None
        emitted = np.searchsorted(starts, cut, side="left")  # entries with a token out; the last may be cut
        heads = buffer.lengths.copy()
        heads[order[emitted - 1]] = cut - starts[emitted - 1]  # so the plan stops at the cut, in full rows
        plan = wrapped_plan(heads, capacity, order[:emitted])
        rows = build_rows(buffer.table, plan, buffer.columns, buffer.lengths, label_pad_id=self.options.label_pad_id)
        return rows, first_label

    def _tail_label(self, columns: ExampleColumns) -> int | None:
        if columns.labels is None:
            return None
        return self.carry.column(columns.labels)[0].values[0].as_py()

    def _count(self, buffer: _Buffer, starts: np.ndarray, ends: np.ndarray, cut: int, full: int) -> None:
        """Add one buffer's numbers: its new examples and tokens, the rows and tokens it emitted."""
        capacity = self.options.max_length
        out = int(np.count_nonzero(starts < cut)) - int(self.carry_continues and cut > 0)  # a tail's head was out
        self.stats.add(
            PackStats(
                "wrapped",
                capacity,
                examples=len(buffer.new_lengths),
                rows=full,
                packed_examples=out,
                input_tokens=int(buffer.new_lengths.sum()),
                packed_tokens=cut,
                empty_examples=int(np.count_nonzero(buffer.new_lengths == 0)),
                # cut by a row boundary (here, or after this buffer): a carried tail fits in one row, never cut again
                split_examples=int(np.count_nonzero(starts // capacity != (ends - 1) // capacity)),
            )
        )

    def _carry_from(self, table, columns, order, starts, ends, cut: int) -> None:
        """Keep the tokens from ``cut`` on (under one row) as the carry: maybe an example's tail, then whole ones."""
        left = np.flatnonzero(ends > cut)
        if not len(left):
            self.carry, self.carry_continues = None, False
            return
        first, offset = int(left[0]), cut - int(starts[left[0]])
        head = table.take(pa.array(order[first : first + 1]))
        if offset:
            for name in columns.tokens:
                tail = pc.list_slice(head.column(name), offset)
                head = head.set_column(head.schema.get_field_index(name), name, tail)
        self.carry = pa.concat_tables([head, table.take(pa.array(order[left[1:]]))])
        # a tail of an example cut here, or (nothing out: cut == 0) the old carry's tail going on
        self.carry_continues = bool(offset) or (cut == 0 and self.carry_continues)


def _wrapped_rows(
    tables: Iterator[pa.Table], packer: _WrappedPacker, state: dict, source_state: Callable[[], Any]
) -> Iterator[dict]:
    """The rows of ``tables``; ``state`` (updated before each row) says how to resume after it.

    ``state`` holds ``source`` (the source's state at the start of the current buffer),
    ``buffer`` (the packer's state then) and ``rows_yielded`` (rows of this buffer already out);
    resuming means passing the tables from ``state["source"]`` on and a packer loaded with
    ``state["buffer"]``: the rows already yielded are skipped.
    """
    start, skip = state.get("source"), state.get("rows_yielded", 0)
    while True:
        buffer_state = packer.state()
        table = next(tables, None)
        rows, first_label = packer.rows(table)
        state.update(source=start, buffer=buffer_state, rows_yielded=skip)
        if rows is not None:
            for row in row_dicts(rows, first_label, skip):
                state["rows_yielded"] += 1
                yield row
        if table is None:
            logger.info("pack_dataset (streaming): %s", packer.stats.summary())
            return
        start, skip = source_state(), 0


class WrappedExamplesIterable(BaseExamplesIterable):
    """The rows of a ``datasets.IterableDataset`` packed ``"wrapped"``, as ``datasets`` iterates them, resumable.

    Its state is ``_wrapped_rows``'s (see there); one shard, so one dataloader worker reads it.
    """

    def __init__(self, source: Any, options: PackOptions, stats: PackStats) -> None:
        super().__init__()
        self.source, self.options, self.stats = source, options, stats

    def _init_state_dict(self) -> dict:
        self._state_dict = {"source": None, "buffer": None, "rows_yielded": 0, "type": type(self).__name__}
        return self._state_dict

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        state = self._state_dict if self._state_dict is not None else self._init_state_dict()
        packer = _WrappedPacker(self.options, self.stats)
        fresh = state["buffer"] is None
        if fresh:
            self.stats.reset()
        else:
            packer.load_state(state["buffer"])
        reader = SourceReader(self.source, self.options.buffer_size, state["source"])
        yield from enumerate(_wrapped_rows(iter(reader), packer, state, reader.state_dict))
        if fresh:
            warn_if_nothing_packed(self.stats)

    @property
    def num_shards(self) -> int:
        return 1

    def shuffle_data_sources(self, generator: np.random.Generator) -> WrappedExamplesIterable:
        return self  # the rows are shuffled within buffers, seeded by ``seed``

    def shard_data_sources(self, num_shards: int, index: int, contiguous: bool = True) -> WrappedExamplesIterable:
        return self  # one shard: only worker 0 is given it

    def reshard_data_sources(self) -> WrappedExamplesIterable:
        return self


def wrapped_stream_rows(tables: Iterator[pa.Table], options: PackOptions, stats: PackStats) -> Iterator[dict]:
    """Packed rows (dicts of lists) of a stream of example tables; ``stats`` is reset, then filled as it goes."""
    stats.reset()
    yield from _wrapped_rows(iter(tables), _WrappedPacker(options, stats), {}, lambda: None)
