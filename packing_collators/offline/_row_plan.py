"""Where every token of a packed dataset goes: the row plan, for bin packing, splitting or wrapping.

A plan is the engine's :class:`Segments`, row after row: each segment is a run of one example's
tokens (``example``: which example, ``skip``: from which of its tokens, ``length``: how many),
and ``row_offsets`` cuts them into rows. Examples ``S0, S1, S2`` of lengths ``[3, 5, 2]``::

    bins (bfd), capacity 8          split, capacity 4            wrapped, capacity 4
    row 0: S0 S0 S0 S1 S1 S1 S1 S1  row 0: S1 S1 S1 S1  [4]      row 0: S0 S0 S0 S1  [3, 1]
    row 1: S2 S2                    row 1: S0 S0 S0 S1  [3, 1]   row 1: S1 S1 S1 S1  [4]
                                    row 2: S2 S2        [2]      row 2: S2 S2        [2]
    example [0, 1, 2]               example [1, 0, 1, 2]         example [0, 1, 1, 2]
    skip    [0, 0, 0]               skip    [0, 0, 4, 0]         skip    [0, 0, 1, 0]

``restarts`` marks the segments whose first label is ``label_pad_id``: an example's first token,
and each piece of a split example (a segment of its own); a wrapped fragment continues its example.
Any row range of a plan is a plan (:meth:`RowPlan.rows`): chunks and the shards of a sharded
build are slices. Everything is a handful of numpy operations over segments (never over
tokens): one CSR reorder for bins, one ``union1d`` of boundaries for wrapping, one ``repeat``
for pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._ranges import ranges, segment_positions
from ..engine import PackingResult, Segments

__all__ = ["Pieces", "RowPlan", "bin_plan", "shard_bounds", "split_pieces", "wrapped_plan"]


@dataclass(frozen=True, eq=False)
class RowPlan(Segments):
    """The layout of packed rows over a table of examples: the engine's :class:`Segments` plus ``restarts``.

    Attributes (besides those of :class:`Segments`):
        restarts: bool (s,) segments whose first label is ``label_pad_id``.

    ``rows(first, last)`` is :meth:`Segments.row_range` keeping ``restarts`` (a method here, where
    the engine's ``rows`` lists the rows' examples).
    """

    restarts: np.ndarray

    def rows(self, first: int, last: int) -> RowPlan:
        """The plan of rows ``first`` to ``last - 1`` only (a chunk, or one machine's shard).

        >>> plan = wrapped_plan(np.array([3, 5, 2]), 4, order=np.arange(3))
        >>> part = plan.rows(1, 3)
        >>> part.example.tolist(), part.skip.tolist(), part.length.tolist(), part.row_offsets.tolist()
        ([1, 2], [1, 0], [4, 2], [0, 1, 2])
        """
        part = self.row_range(first, last)
        s0, s1 = self.segment_range(first, last)
        return RowPlan(part.capacity, part.example, part.skip, part.length, part.row_offsets, self.restarts[s0:s1])


def shard_bounds(num_rows: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """Rows ``[first, last)`` of shard ``shard_index``: contiguous, the first ``num_rows % num_shards`` one row longer.

    >>> [shard_bounds(10, 3, i) for i in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    size, extra = divmod(num_rows, num_shards)
    first = shard_index * size + min(shard_index, extra)
    return first, first + size + (shard_index < extra)


@dataclass(frozen=True, eq=False)
class Pieces:
    """Examples cut into pieces of at most ``capacity`` tokens, which the engine packs as if examples.

    Attributes:
        example: int64 (p,) the example of each piece.
        skip: int64 (p,) where the piece starts in its example.
        lengths: int64 (p,) tokens of each piece (a zero-length example stays one empty piece).
    """

    example: np.ndarray
    skip: np.ndarray
    lengths: np.ndarray

    @property
    def split_examples(self) -> int:
        """Examples cut into two or more pieces (counted at each one's second piece)."""
        return int(np.count_nonzero((self.skip[1:] > 0) & (self.skip[:-1] == 0)))


def split_pieces(lengths: np.ndarray, capacity: int) -> Pieces:
    """Each example longer than ``capacity`` cut into pieces of ``capacity`` tokens, the last one shorter.

    >>> pieces = split_pieces(np.array([3, 10, 0]), capacity=4)
    >>> pieces.example.tolist(), pieces.skip.tolist(), pieces.lengths.tolist(), pieces.split_examples
    ([0, 1, 1, 1, 2], [0, 0, 4, 8, 0], [3, 4, 4, 2, 0], 1)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = np.maximum(1, -(-lengths // capacity))
    example = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    skip = segment_positions(counts) * capacity
    return Pieces(example, skip, np.minimum(lengths[example] - skip, capacity))


def bin_plan(result: PackingResult, row_order: np.ndarray | None = None, pieces: Pieces | None = None) -> RowPlan:
    """The plan of an engine result's rows, in ``row_order`` (all rows in packing order by default).

    ``row_order`` may be a permutation of the rows (shuffling) or a subset of them. With
    ``pieces``, the engine packed piece lengths and its indices are pieces.

    >>> from packing_collators import pack_lengths
    >>> plan = bin_plan(pack_lengths([5, 2, 4, 1, 3], capacity=8), row_order=np.array([1, 0]))
    >>> plan.example.tolist(), plan.length.tolist(), plan.row_offsets.tolist()
    ([1, 2, 3, 0, 4], [2, 4, 1, 5, 3], [0, 3, 5])
    """
    offsets = result.row_offsets
    if row_order is None:
        entries = np.arange(len(result.example))
        row_segments = offsets
    else:
        counts = np.diff(offsets)[row_order]
        row_segments = np.r_[0, np.cumsum(counts)].astype(np.int64)
        entries = ranges(offsets[:-1][row_order], counts)
    indices = result.example[entries]
    if pieces is None:
        order, skip = indices, np.zeros(len(indices), np.int64)
    else:
        order, skip = pieces.example[indices], pieces.skip[indices]
    return RowPlan(
        capacity=result.capacity,
        example=order,
        skip=skip,
        length=result.length[entries],
        row_offsets=row_segments,
        restarts=np.ones(len(indices), bool),
    )


def wrapped_plan(lengths: np.ndarray, capacity: int, order: np.ndarray) -> RowPlan:
    """Examples concatenated in ``order`` and cut into full rows (the last may be shorter).

    Zero-length examples are left out. An example cut by a row boundary becomes
    one segment per row it touches.

    >>> plan = wrapped_plan(np.array([3, 5, 2]), 4, order=np.arange(3))
    >>> plan.length.tolist(), plan.row_offsets.tolist(), plan.example.tolist(), plan.skip.tolist()
    ([3, 1, 4, 2], [0, 2, 3, 4], [0, 1, 1, 2], [0, 0, 1, 0])
    """
    order = order[lengths[order] > 0].astype(np.int64)
    ends = np.cumsum(lengths[order].astype(np.int64))
    total = int(ends[-1]) if len(ends) else 0
    bounds = np.union1d(np.r_[0, ends], np.arange(0, total, capacity, dtype=np.int64))
    segment_starts = bounds[:-1]
    num_rows = -(-total // capacity)
    row_segments = np.r_[0, np.cumsum(np.bincount(segment_starts // capacity, minlength=num_rows))].astype(np.int64)
    entry = np.searchsorted(ends, segment_starts, side="right")
    skip = segment_starts - np.r_[0, ends][entry]
    return RowPlan(
        capacity=capacity,
        example=order[entry],
        skip=skip,
        length=np.diff(bounds),
        row_offsets=row_segments,
        restarts=skip == 0,
    )
