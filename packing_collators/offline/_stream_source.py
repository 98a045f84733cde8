"""A stream read as Arrow tables of ``buffer_size`` examples, and packed rows given back as dicts.

    IterableDataset (Arrow-backed)  --iter(batch_size)-->        pa.Table of buffer_size examples
    IterableDataset (generator)     --iter, pa.Table.from_pydict-->    "
    any iterator of example dicts   --islice, pa.Table.from_pylist-->  "
    rows (pa.Table)                 --256 rows at a time, to_pylist-->  dicts of lists

Used by both streaming packers (``_stream_bins``, ``_stream_wrapped``). Cost: one Arrow
conversion per buffer in, one ``to_pylist`` per 256 rows out (a buffer's rows as lists would be ~100 MB at 2048).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import pyarrow as pa

from .._compat import examples_iterable
from ._empty import typed_empty

__all__ = ["ROWS_PER_BATCH", "SourceReader", "example_tables", "row_dicts"]

ROWS_PER_BATCH = 256
"""Rows converted to Python lists at a time (a buffer's rows as lists would be ~100 MB at 2048)."""


class SourceReader:
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
            yield typed_empty(batch if self.arrow else pa.Table.from_pydict(batch))

    def state_dict(self) -> dict:
        return self.dataset.state_dict()


def example_tables(source: Any, size: int) -> Iterator[pa.Table]:
    """The stream as Arrow tables of at most ``size`` examples (list-of-null columns as int64 lists).

    >>> [table.num_rows for table in example_tables(iter([{"input_ids": [1]}] * 5), 2)]
    [2, 2, 1]
    """
    import datasets

    if isinstance(source, datasets.IterableDataset):
        yield from SourceReader(source, size)
        return
    iterator = iter(source)
    while batch := list(islice(iterator, size)):
        yield typed_empty(pa.Table.from_pylist(batch))


def row_dicts(rows: pa.Table, first_label: int | None = None, skip: int = 0) -> Iterator[dict]:
    """``rows`` as dicts of lists from row ``skip`` on, a record batch at a time; row 0 gets ``first_label``.

    >>> list(row_dicts(pa.table({"labels": [[5, 6], [7]]}), first_label=-1))
    [{'labels': [-1, 6]}, {'labels': [7]}]
    """
    for i, batch in enumerate(rows.slice(skip).to_batches(max_chunksize=ROWS_PER_BATCH)):
        dicts = batch.to_pylist()
        if i == 0 and skip == 0 and first_label is not None:
            dicts[0]["labels"][0] = first_label
        yield from dicts
