"""Streaming packing: examples in, packed rows out, with memory bounded by a buffer.

    stream --_stream_source: tables of buffer_size examples--> bins (_stream_bins)       --> row dicts
                                                            or wrapped (_stream_wrapped)

A ``datasets.IterableDataset`` comes back as one (``IterableDatasetDict`` split by split), in its
format; any other iterator as a generator of row dicts. ``"wrapped"`` over an ``IterableDataset``
resumes from a ``state_dict()``; the bin strategies carry the emptiest rows' examples from
buffer to buffer. Cost: see each packer's module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from .._splits import per_split
from ..engine import PackStats
from ._empty import warn_if_nothing_packed
from ._options import PackOptions
from ._stream_bins import bin_stream_rows
from ._stream_source import example_tables
from ._stream_wrapped import WrappedExamplesIterable, wrapped_stream_rows

__all__ = ["pack_stream", "pack_streaming"]


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
    packer = wrapped_stream_rows if options.strategy == "wrapped" else bin_stream_rows
    return packer(iter(examples), options, stats)


def pack_streaming(source: Any, options: PackOptions):
    """``(rows, stats)`` for a stream: an ``IterableDataset`` (dict) for one, else a generator of row dicts."""
    import datasets

    if isinstance(source, datasets.IterableDatasetDict):
        return per_split(source, lambda split, name: pack_streaming(split, options), datasets.IterableDatasetDict)
    stats = PackStats(options.strategy, options.max_length)
    if isinstance(source, datasets.IterableDataset) and options.strategy == "wrapped":
        packed = datasets.IterableDataset(WrappedExamplesIterable(source, options, stats), split=source.split)
        return _with_format_of(source, packed), stats

    def rows():
        stats.reset()
        yield from pack_stream(example_tables(source, options.buffer_size), options, stats)
        warn_if_nothing_packed(stats)

    if isinstance(source, datasets.IterableDataset):
        return _with_format_of(source, datasets.IterableDataset.from_generator(rows)), stats
    return rows(), stats


def _with_format_of(source: Any, packed: Any) -> Any:
    """``packed`` in the stream's format (``with_format("numpy")`` in, numpy rows out), as the map-style path keeps it."""
    formatting = getattr(source, "_formatting", None)  # datasets keeps an IterableDataset's format only there
    format_type = getattr(formatting, "format_type", None)
    return packed if format_type is None else packed.with_format(format_type)
