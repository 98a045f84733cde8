"""Where every token of a packed dataset goes: the row plan, for bin packing, splitting or wrapping.

A plan is a list of *segments*, row after row: each segment is a run of one example's tokens
(``order``: which example, ``skip``: from which of its tokens, ``segment_lengths``: how many),
and ``row_segments`` cuts the list into rows. Examples ``S0, S1, S2`` of lengths ``[3, 5, 2]``::

    bins (bfd), capacity 8          split, capacity 4            wrapped, capacity 4
    row 0: S0 S0 S0 S1 S1 S1 S1 S1  row 0: S1 S1 S1 S1  [4]      row 0: S0 S0 S0 S1  [3, 1]
    row 1: S2 S2                    row 1: S0 S0 S0 S1  [3, 1]   row 1: S1 S1 S1 S1  [4]
                                    row 2: S2 S2        [2]      row 2: S2 S2        [2]
    order [0, 1, 2]                 order [1, 0, 1, 2]           order [0, 1, 1, 2]
    skip  [0, 0, 0]                 skip  [0, 0, 4, 0]           skip  [0, 0, 1, 0]

``restarts`` marks the segments whose first label is ``label_pad_id``: an example's first token,
and each piece of a split example (a segment of its own); a wrapped fragment continues its example.
Any row range of a plan is a plan (:meth:`RowPlan.rows`): chunks and the shards of a sharded
build are slices. Everything is a handful of numpy operations over segments (never over
tokens): one CSR reorder for bins, one ``union1d`` of boundaries for wrapping, one ``repeat``
for pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .._ranges import ranges, segment_positions
from ..engine import PackingResult

__all__ = ["Pieces", "RowPlan", "bin_plan", "shard_bounds", "split_pieces", "wrapped_plan"]


@dataclass(frozen=True, eq=False)
class RowPlan:
    """The layout of packed rows over a table of examples (``s`` segments, in row order).

    Attributes:
        capacity: tokens per row.
        order: int64 (s,) the example each segment's tokens come from.
        skip: int64 (s,) tokens of that example before the segment's first token.
        segment_lengths: int64 (s,) tokens of each segment.
        row_segments: int64 (rows + 1,) where each row starts in the segments.
        restarts: bool (s,) segments whose first label is ``label_pad_id``.
    """

    capacity: int
    order: np.ndarray
    skip: np.ndarray
    segment_lengths: np.ndarray
    row_segments: np.ndarray
    restarts: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.row_segments) - 1

    @cached_property
    def segment_starts(self) -> np.ndarray:
        """int64 (s + 1,) where each segment starts in the rows laid end to end, then their total length."""
        return np.r_[0, np.cumsum(self.segment_lengths)].astype(np.int64)

    @property
    def row_starts(self) -> np.ndarray:
        """int64 (rows + 1,) where each row starts in the rows laid end to end, then their total length."""
        return self.segment_starts[self.row_segments]

    @property
    def total_tokens(self) -> int:
        """Tokens in the segments (every row of the plan, if ``row_segments`` covers them all)."""
        return int(self.segment_starts[-1])

    def rows(self, first: int, last: int) -> RowPlan:
        """The plan of rows ``first`` to ``last - 1`` only (a chunk, or one machine's shard).

        >>> plan = wrapped_plan(np.array([3, 5, 2]), 4, order=np.arange(3))
        >>> part = plan.rows(1, 3)
        >>> part.order.tolist(), part.skip.tolist(), part.segment_lengths.tolist(), part.row_segments.tolist()
        ([1, 2], [1, 0], [4, 2], [0, 1, 2])
        """
        s0, s1 = int(self.row_segments[first]), int(self.row_segments[last])
        return RowPlan(
            capacity=self.capacity,
            order=self.order[s0:s1],
            skip=self.skip[s0:s1],
            segment_lengths=self.segment_lengths[s0:s1],
            row_segments=self.row_segments[first : last + 1] - s0,
            restarts=self.restarts[s0:s1],
        )


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
    >>> plan.order.tolist(), plan.segment_lengths.tolist(), plan.row_segments.tolist()
    ([1, 2, 3, 0, 4], [2, 4, 1, 5, 3], [0, 3, 5])
    """
    offsets = result.row_offsets
    if row_order is None:
        entries = np.arange(len(result.indices))
        row_segments = offsets
    else:
        counts = np.diff(offsets)[row_order]
        row_segments = np.r_[0, np.cumsum(counts)].astype(np.int64)
        entries = ranges(offsets[:-1][row_order], counts)
    indices = result.indices[entries]
    if pieces is None:
        order, skip = indices, np.zeros(len(indices), np.int64)
    else:
        order, skip = pieces.example[indices], pieces.skip[indices]
    return RowPlan(
        capacity=result.capacity,
        order=order,
        skip=skip,
        segment_lengths=result.seq_lengths[entries],
        row_segments=row_segments,
        restarts=np.ones(len(indices), bool),
    )


def wrapped_plan(lengths: np.ndarray, capacity: int, order: np.ndarray) -> RowPlan:
    """Examples concatenated in ``order`` and cut into full rows (the last may be shorter).

    Zero-length examples are left out. An example cut by a row boundary becomes
    one segment per row it touches.

    >>> plan = wrapped_plan(np.array([3, 5, 2]), 4, order=np.arange(3))
    >>> plan.segment_lengths.tolist(), plan.row_segments.tolist(), plan.order.tolist(), plan.skip.tolist()
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
        order=order[entry],
        skip=skip,
        segment_lengths=np.diff(bounds),
        row_segments=row_segments,
        restarts=skip == 0,
    )
