"""Streaming packing: examples in, packed rows out, with memory bounded by a buffer.

The stream is read ``buffer_size`` examples at a time. With a bin strategy (``bfd``,
``ffd``, ``next_fit``) each buffer (plus the examples carried from the last one) is
packed with the engine; rows that are full enough are emitted (shuffled within the
buffer), and the examples of the emptiest rows are carried into the next buffer::

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
yields), a record batch at a time.

With ``strategy="wrapped"`` (continued pretraining) each buffer's examples are
concatenated after the unfinished row carried from the last buffer and cut into
full rows; only the unfinished row (fewer than ``max_length`` tokens) is carried.
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
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._compat import BaseExamplesIterable, examples_iterable
from ..engine import PackStats, check_not_too_long, pack_lengths
from ._arrow_rows import build_rows
from ._columns import ExampleColumns, check_unpadded, example_columns, token_lengths
from ._empty import warn_if_nothing_packed
from ._options import MAX_LENGTH_FIX, PackOptions
from ._row_plan import bin_plan, wrapped_plan

__all__ = ["pack_stream", "pack_streaming"]

logger = logging.getLogger(__name__)

ROWS_PER_BATCH = 256
"""Rows converted to Python lists at a time (a buffer's rows as lists would be ~100 MB at 2048)."""


def _typed(table: pa.Table) -> pa.Table:
    """``table`` with list-of-null columns (a batch whose lists are all empty) as lists of int64."""
    for i, field in enumerate(table.schema):
        if pa.types.is_list(field.type) and pa.types.is_null(field.type.value_type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.list_(pa.int64())))
    return table


class _SourceReader:
    """A ``datasets.IterableDataset`` as Arrow tables of ``size`` examples, with its state after each.

    An Arrow-backed source is read as Arrow; any other (``from_generator``, after ``map``) as
    Python batches (``datasets`` would convert it one example at a time, and fails on an empty list).
    """

    def __init__(self, source: Any, size: int, state: dict | None = None) -> None:
        self.arrow = examples_iterable(source).iter_arrow is not None
        self.dataset = source.with_format("arrow" if self.arrow else None)
        if state is not None:
            self.dataset.load_state_dict(state)
        self.size = size

    def __iter__(self) -> Iterator[pa.Table]:
        for batch in self.dataset.iter(batch_size=self.size):
            yield _typed(batch if self.arrow else pa.Table.from_pydict(batch))

    def state_dict(self) -> dict:
        return self.dataset.state_dict()


def _example_tables(source: Any, size: int) -> Iterator[pa.Table]:
    """The stream as Arrow tables of at most ``size`` examples."""
    import datasets

    if isinstance(source, datasets.IterableDataset):
        yield from _SourceReader(source, size)
        return
    iterator = iter(source)
    while batch := list(islice(iterator, size)):
        yield _typed(pa.Table.from_pylist(batch))


def _row_dicts(rows: pa.Table, first_label: int | None = None, skip: int = 0) -> Iterator[dict]:
    """``rows`` as dicts of lists from row ``skip`` on, a record batch at a time; row 0 gets ``first_label``."""
    for i, batch in enumerate(rows.slice(skip).to_batches(max_chunksize=ROWS_PER_BATCH)):
        dicts = batch.to_pylist()
        if i == 0 and skip == 0 and first_label is not None:
            dicts[0]["labels"][0] = first_label
        yield from dicts


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

    ``"wrapped"`` cuts the concatenation into full rows; a row that starts mid-example keeps its label:

    >>> ids = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11], [12]]
    >>> tables = [pa.table({"input_ids": ids[:2], "labels": ids[:2]}), pa.table({"input_ids": ids[2:], "labels": ids[2:]})]
    >>> stats = PackStats("wrapped", 4)
    >>> options = PackOptions(max_length=4, strategy="wrapped", shuffle_rows=False)
    >>> for row in pack_stream(tables, options, stats):
    ...     print(row["labels"], row["seq_lengths"])
    [-100, 2, 3, -100] [3, 1]
    [5, 6, 7, 8] [4]
    [9, -100, 11, -100] [1, 2, 1]
    >>> stats.rows, stats.packed_examples, stats.split_examples
    (3, 4, 1)
    """
    if options.strategy == "wrapped":
        stats.reset()
        yield from _wrapped_rows(iter(examples), _WrappedPacker(options, stats), {}, lambda: None)
        return
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
        yield from _row_dicts(
            build_rows(table, bin_plan(result, emit), columns, lengths, label_pad_id=options.label_pad_id)
        )
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


# ----------------------------------------------------------------------------- wrapped


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
            columns = example_columns(table.schema, self.options.keep_columns)
            new_lengths = token_lengths(table, columns, first_index=self.seen)
            check_unpadded(table, first_index=self.seen, stream=True)
            self.seen += len(table)
            order = self.rng.permutation(len(table)) if self.options.shuffle_rows else np.arange(len(table))
            if self.carry is not None:
                table = pa.concat_tables([self.carry, table], promote_options="permissive")
        else:
            table = self.carry
        columns = example_columns(table.schema, self.options.keep_columns)
        lengths = token_lengths(table, columns)
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
            for row in _row_dicts(rows, first_label, skip):
                state["rows_yielded"] += 1
                yield row
        if table is None:
            logger.info("pack_dataset (streaming): %s", packer.stats.summary())
            return
        start, skip = source_state(), 0


class _WrappedExamplesIterable(BaseExamplesIterable):
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
        reader = _SourceReader(self.source, self.options.buffer_size, state["source"])
        yield from enumerate(_wrapped_rows(iter(reader), packer, state, reader.state_dict))
        if fresh:
            warn_if_nothing_packed(self.stats)

    @property
    def num_shards(self) -> int:
        return 1

    def shuffle_data_sources(self, generator: np.random.Generator) -> _WrappedExamplesIterable:
        return self  # the rows are shuffled within buffers, seeded by ``seed``

    def shard_data_sources(self, num_shards: int, index: int, contiguous: bool = True) -> _WrappedExamplesIterable:
        return self  # one shard: only worker 0 is given it

    def reshard_data_sources(self) -> _WrappedExamplesIterable:
        return self


def pack_streaming(source: Any, options: PackOptions):
    """``(rows, stats)`` for a stream: an ``IterableDataset`` (dict) for one, else a generator of row dicts."""
    import datasets

    if isinstance(source, datasets.IterableDatasetDict):
        results = {name: pack_streaming(split, options) for name, split in source.items()}
        return datasets.IterableDatasetDict({k: v[0] for k, v in results.items()}), {
            k: v[1] for k, v in results.items()
        }
    stats = PackStats(options.strategy, options.max_length)
    if isinstance(source, datasets.IterableDataset) and options.strategy == "wrapped":
        packed = datasets.IterableDataset(_WrappedExamplesIterable(source, options, stats), split=source.split)
        return _with_format_of(source, packed), stats

    def rows():
        stats.reset()
        yield from pack_stream(_example_tables(source, options.buffer_size), options, stats)
        warn_if_nothing_packed(stats)

    if isinstance(source, datasets.IterableDataset):
        return _with_format_of(source, datasets.IterableDataset.from_generator(rows)), stats
    return rows(), stats


def _with_format_of(source: Any, packed: Any) -> Any:
    """``packed`` in the stream's format (``with_format("numpy")`` in, numpy rows out), as the map-style path keeps it."""
    formatting = getattr(source, "_formatting", None)  # datasets keeps an IterableDataset's format only there
    format_type = getattr(formatting, "format_type", None)
    return packed if format_type is None else packed.with_format(format_type)
