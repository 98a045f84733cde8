"""Where every token of a packed dataset goes: the row plan, for bin packing or wrapping.

A plan lays the kept examples end to end in ``order`` (the *stream*), cuts the
stream into rows, and each row into segments (one per example, or one per
example fragment when wrapping). Examples ``S0, S1, S2`` of lengths ``[3, 5, 2]``::

    bins (bfd), capacity 8                       wrapped, capacity 4
    row 0: S0 S0 S0 S1 S1 S1 S1 S1  [3, 5]       row 0: S0 S0 S0 S1  [3, 1]
    row 1: S2 S2                    [2]          row 1: S1 S1 S1 S1  [4]
                                                 row 2: S2 S2        [2]

Everything is a handful of numpy operations over examples (never over tokens):
one sort-free CSR reorder for bins, one ``union1d`` of boundaries for wrapping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine import PackingResult

__all__ = ["RowPlan", "bin_plan", "wrapped_plan"]


@dataclass(frozen=True, eq=False)
class RowPlan:
    """The layout of packed rows over a table of examples.

    Attributes:
        capacity: tokens per row.
        order: int64 (k,) example indices in stream order, each at most once.
        kept: int64 (k,) tokens of each of those examples in the stream (after truncation).
        truncate: whether some example is cut to ``capacity`` tokens.
        segment_lengths: int64 (s,) tokens of each segment, row after row.
        segment_example: int64 (s,) position in ``order`` of each segment's example.
        row_segments: int64 (rows + 1,) where each row starts in ``segment_lengths``.
    """

    capacity: int
    order: np.ndarray
    kept: np.ndarray
    truncate: bool
    segment_lengths: np.ndarray
    segment_example: np.ndarray
    row_segments: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.row_segments) - 1

    @property
    def example_starts(self) -> np.ndarray:
        """int64 (k + 1,) where each example starts in the stream, then the stream's length."""
        return np.r_[0, np.cumsum(self.kept)].astype(np.int64)

    @property
    def row_starts(self) -> np.ndarray:
        """int64 (rows + 1,) where each row starts in the stream, then the stream's length."""
        return np.r_[0, np.cumsum(self.segment_lengths)][self.row_segments].astype(np.int64)


def bin_plan(result: PackingResult, row_order: np.ndarray | None = None) -> RowPlan:
    """The plan of an engine result's rows, in ``row_order`` (all rows in packing order by default).

    ``row_order`` may be a permutation of the rows (shuffling) or a subset of them.

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
        entries = np.arange(row_segments[-1]) + np.repeat(offsets[:-1][row_order] - row_segments[:-1], counts)
    kept = result.seq_lengths[entries]
    return RowPlan(
        capacity=result.capacity,
        order=result.indices[entries],
        kept=kept,
        truncate=bool(result.num_truncated),
        segment_lengths=kept,
        segment_example=np.arange(len(kept), dtype=np.int64),
        row_segments=row_segments,
    )


def wrapped_plan(lengths: np.ndarray, capacity: int, order: np.ndarray) -> RowPlan:
    """Examples concatenated in ``order`` and cut into full rows (the last may be shorter).

    Zero-length examples are left out. An example cut by a row boundary becomes
    one segment per row it touches.

    >>> plan = wrapped_plan(np.array([3, 5, 2]), 4, order=np.arange(3))
    >>> plan.segment_lengths.tolist(), plan.row_segments.tolist(), plan.segment_example.tolist()
    ([3, 1, 4, 2], [0, 2, 3, 4], [0, 1, 1, 2])
    """
    order = order[lengths[order] > 0].astype(np.int64)
    kept = lengths[order].astype(np.int64)
    ends = np.cumsum(kept)
    total = int(ends[-1]) if len(ends) else 0
    bounds = np.union1d(np.r_[0, ends], np.arange(0, total, capacity, dtype=np.int64))
    segment_starts = bounds[:-1]
    num_rows = -(-total // capacity)
    row_of_segment = segment_starts // capacity
    row_segments = np.r_[0, np.cumsum(np.bincount(row_of_segment, minlength=num_rows))].astype(np.int64)
    return RowPlan(
        capacity=capacity,
        order=order,
        kept=kept,
        truncate=False,
        segment_lengths=np.diff(bounds),
        segment_example=np.searchsorted(ends, segment_starts, side="right"),
        row_segments=row_segments,
    )
