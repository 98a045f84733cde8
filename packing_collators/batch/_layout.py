"""SegmentLayout: the segments of a packed batch, laid end to end over its tokens (row after row).

For segment lengths ``[3, 2, 4]``::

    lengths       = [3, 2, 4]                      int64 (n,)
    cu_seq_lens   = [0, 3, 5, 9]                   int32 (n + 1,): where each starts, then the total
    max_length    = 4                              the longest segment
    position_ids  = [0, 1, 2, 0, 1, 0, 1, 2, 3]    int64 (T,): each token's place in its segment
    seq_idx       = [0, 0, 0, 1, 1, 2, 2, 2, 2]    int32 (T,): each token's segment
    padded_to(12) = lengths [3, 2, 4, 3]           padding: a segment of its own

The collators build a batch from a layout (:func:`segment_layout`); every reader gets one back from
a batch (:func:`~packing_collators.batch.read_layout`), so both sides describe segments one way.
numpy on the host; ``cu_seq_lens_on(device)`` is the torch view a model's call takes. Cost: a
``cumsum`` and a ``repeat`` over the segments or tokens, no Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._ranges import segment_positions

__all__ = ["SegmentLayout", "segment_layout"]


@dataclass(frozen=True, eq=False)
class SegmentLayout:
    """Where each segment of a batch's flattened tokens starts and how long it is.

    Attributes:
        lengths: int64 (n,) tokens per segment.
        cu_seq_lens: int32 (n + 1,) cumulative lengths, starting at 0.
        max_length: the longest segment (0 when there is none).
    """

    lengths: np.ndarray
    cu_seq_lens: np.ndarray
    max_length: int

    @classmethod
    def from_cu_seq_lens(cls, cu_seq_lens) -> SegmentLayout:
        """The layout of boundaries ``[0, ..., total]`` (a batch's ``cu_seq_lens``; empty segments kept).

        >>> SegmentLayout.from_cu_seq_lens([0, 3, 5]).lengths.tolist()
        [3, 2]
        """
        return segment_layout(np.diff(np.asarray(cu_seq_lens, dtype=np.int64)))

    @property
    def count(self) -> int:
        """How many segments."""
        return len(self.lengths)

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

    def padded_to(self, total: int | None) -> SegmentLayout:
        """The layout with the tokens up to ``total`` as one more segment (padding); itself when nothing is missing.

        >>> segment_layout([3, 2]).padded_to(8).lengths.tolist(), segment_layout([3, 2]).padded_to(5).lengths.tolist()
        ([3, 2, 3], [3, 2])
        """
        if total is None or total <= self.total:
            return self
        return segment_layout(np.r_[self.lengths, total - self.total])

    def cu_seq_lens_on(self, device=None):
        """``cu_seq_lens`` as an int32 torch tensor on ``device`` (a model's call takes tensors)."""
        import torch

        return torch.as_tensor(self.cu_seq_lens, device=device)


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
