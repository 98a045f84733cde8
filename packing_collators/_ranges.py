"""Runs of consecutive integers laid end to end, without a Python loop: one home for the idiom.

For ``starts = [10, 0, 7]`` and ``lengths = [3, 2, 1]``::

    ranges(starts, lengths)     = [10, 11, 12, 0, 1, 7]     arange(s, s + n) for each pair, concatenated
    segment_positions(lengths)  = [ 0,  1,  2, 0, 1, 0]     each item's place in its segment (positions)

Every collator, the offline row plan and the sampler's epoch plan build positions, gather indices
and scatter targets this way. Cost: one ``cumsum``, one ``repeat`` and one ``arange`` over the
total length. No torch here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ranges", "segment_positions"]


def ranges(starts, lengths) -> np.ndarray:
    """int64 (sum(lengths),): ``arange(start, start + length)`` for each pair, concatenated.

    >>> ranges([10, 0, 7], [3, 2, 1]).tolist()
    [10, 11, 12, 0, 1, 7]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    firsts = np.cumsum(lengths) - lengths  # where each run begins in the output
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(np.asarray(starts, np.int64) - firsts, lengths)


def segment_positions(lengths, start: int = 0) -> np.ndarray:
    """int64 (sum(lengths),): each item's position inside its segment, restarting at ``start`` per segment.

    >>> segment_positions([3, 2, 4]).tolist()
    [0, 1, 2, 0, 1, 0, 1, 2, 3]
    """
    return ranges(np.full(len(lengths), start, np.int64), lengths)
