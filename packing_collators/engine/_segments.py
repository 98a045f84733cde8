"""The one representation of a packing: rows of segments, each a run of one example's tokens.

Every packer of the package stores its rows this way (CSR): the engine's
:class:`PackingResult`, the offline row plan and the sampler's epoch plan are this type
plus what each adds. Examples ``S0, S1, S2`` of lengths ``[3, 5, 2]`` wrapped into rows of 4::

    row 0: S0 S0 S0 S1     segments 0, 1   example [0, 1]  skip [0, 0]  length [3, 1]
    row 1: S1 S1 S1 S1     segment  2      example [1]     skip [1]     length [4]
    row 2: S2 S2           segment  3      example [2]     skip [0]     length [2]
    row_offsets [0, 2, 3, 4]

``skip`` is how many of the example's tokens come before the segment (0 unless an
example is split or wrapped over rows). Efficiency and the lower bound come from
:class:`RowMeasures` (``_stats.py``). Cost: numpy over segments, never over tokens.
No torch, transformers or datasets here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ._stats import RowMeasures

__all__ = ["Segments"]


@dataclass(frozen=True, eq=False)
class Segments(RowMeasures):
    """Rows of segments (``s`` of them, row after row): which example, from which token, how many.

    Attributes:
        capacity: tokens per row.
        example: int64 (s,) the example each segment's tokens come from.
        skip: int64 (s,) tokens of that example before the segment's first token.
        length: int64 (s,) tokens in each segment.
        row_offsets: int64 (rows + 1,) where each row starts in the segments.

    >>> seg = Segments(4, np.array([0, 1, 1, 2]), np.array([0, 0, 1, 0]), np.array([3, 1, 4, 2]), np.array([0, 2, 3, 4]))
    >>> seg.rows, seg.row_tokens.tolist(), seg.total_tokens, seg.num_rows, round(seg.efficiency, 4)
    ([[0, 1], [1], [2]], [4, 4, 2], 10, 3, 0.8333)
    >>> part = seg.row_range(1, 3)
    >>> part.example.tolist(), part.skip.tolist(), part.row_offsets.tolist()
    ([1, 2], [1, 0], [0, 1, 2])
    """

    capacity: int
    example: np.ndarray
    skip: np.ndarray
    length: np.ndarray
    row_offsets: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def num_segments(self) -> int:
        return len(self.example)

    @cached_property
    def segment_starts(self) -> np.ndarray:
        """int64 (s + 1,) where each segment starts in the rows laid end to end, then their total length."""
        return np.r_[0, np.cumsum(self.length)].astype(np.int64)

    @property
    def row_starts(self) -> np.ndarray:
        """int64 (rows + 1,) where each row starts in the rows laid end to end, then their total length."""
        return self.segment_starts[self.row_offsets]

    @property
    def row_tokens(self) -> np.ndarray:
        """int64 (rows,) tokens in each row."""
        return np.diff(self.row_starts)

    @property
    def total_tokens(self) -> int:
        """Tokens in the segments (every row, if ``row_offsets`` covers them all)."""
        return int(self.segment_starts[-1])

    def _tokens_and_rows(self) -> tuple[int, int]:
        return self.total_tokens, self.num_rows

    def row(self, r: int) -> list[int]:
        """The examples of row ``r``, one per segment."""
        return self.example[self.row_offsets[r] : self.row_offsets[r + 1]].tolist()

    @property
    def rows(self) -> list[list[int]]:
        """The rows as lists of examples (one entry per segment)."""
        if not self.num_rows:
            return []
        return [part.tolist() for part in np.split(self.example, self.row_offsets[1:-1])]

    def segment_range(self, first: int, last: int) -> tuple[int, int]:
        """The segments ``[s0, s1)`` of rows ``first`` to ``last - 1``."""
        return int(self.row_offsets[first]), int(self.row_offsets[last])

    def row_range(self, first: int, last: int) -> Segments:
        """The segments of rows ``first`` to ``last - 1`` only (a chunk, or one machine's shard)."""
        s0, s1 = self.segment_range(first, last)
        return Segments(
            self.capacity,
            self.example[s0:s1],
            self.skip[s0:s1],
            self.length[s0:s1],
            self.row_offsets[first : last + 1] - s0,
        )
