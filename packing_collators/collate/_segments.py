"""The flat layout of packed segments: positions, boundaries and segment ids from lengths.

For segment lengths ``[3, 2, 4]``::

    position_ids  = [0, 1, 2, 0, 1, 0, 1, 2, 3]
    seq_idx       = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    cu_seq_lens   = [0, 3, 5, 9]
    max_length    = 4

Everything is numpy, built without a Python loop over tokens (a ``repeat`` and a
``cumsum``), and shared by every collator so they agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._ranges import segment_positions

__all__ = ["SegmentLayout", "into_rows", "segment_layout"]


@dataclass(frozen=True)
class SegmentLayout:
    """Where each segment of a flat row starts and how long it is.

    Attributes:
        lengths: int64 (n,) tokens per segment.
        cu_seq_lens: int32 (n + 1,) cumulative lengths, starting at 0.
        max_length: the longest segment (0 when there is none).
    """

    lengths: np.ndarray
    cu_seq_lens: np.ndarray
    max_length: int

    @property
    def starts(self) -> np.ndarray:
        """int64 (n,) offset of each segment's first token."""
        return self.cu_seq_lens[:-1].astype(np.int64)

    @property
    def total(self) -> int:
        return int(self.cu_seq_lens[-1])

    def position_ids(self, start: int = 0, dtype=np.int64) -> np.ndarray:
        """int64 (total,) position of each token inside its segment, plus ``start`` (``dtype`` to store int32).

        >>> segment_layout([3, 2, 4]).position_ids().tolist()
        [0, 1, 2, 0, 1, 0, 1, 2, 3]
        """
        if not self.total or self.lengths.min() == 0:
            return segment_positions(self.lengths, start).astype(dtype, copy=False)
        # ones everywhere, a step back to `start` at each segment's first token, then cumsum
        steps = np.ones(self.total, dtype=dtype)
        steps[self.cu_seq_lens[1:-1]] = 1 - self.lengths[:-1]
        steps[0] = start
        return np.cumsum(steps, out=steps)

    def seq_idx(self) -> np.ndarray:
        """int32 (total,) index of the segment each token belongs to.

        >>> segment_layout([3, 2, 4]).seq_idx().tolist()
        [0, 0, 0, 1, 1, 2, 2, 2, 2]
        """
        return np.repeat(np.arange(len(self.lengths), dtype=np.int32), self.lengths)


def segment_layout(lengths) -> SegmentLayout:
    """The layout of segments of the given lengths laid end to end.

    >>> layout = segment_layout([3, 2, 4])
    >>> layout.cu_seq_lens.tolist(), layout.max_length
    ([0, 3, 5, 9], 4)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    cu_seq_lens = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seq_lens[1:])
    return SegmentLayout(lengths, cu_seq_lens, int(lengths.max()) if len(lengths) else 0)


def into_rows(values: np.ndarray, target: np.ndarray, shape: tuple[int, int], fill: int) -> np.ndarray:
    """int64 ``shape``: ``values`` placed at the flat positions ``target`` of padded rows, ``fill`` elsewhere.

    ``target`` is ``ranges(row * width + column, lengths)``: each run of tokens from where it starts in its row.

    >>> from packing_collators._ranges import ranges
    >>> into_rows(np.array([5, 6, 7, 8]), ranges([0, 4], [3, 1]), (2, 3), fill=0).tolist()
    [[5, 6, 7], [0, 8, 0]]
    """
    out = np.full(shape[0] * shape[1], fill, np.int64)
    out[target] = values
    return out.reshape(shape)
