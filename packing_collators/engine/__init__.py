"""The packing engine: example lengths in, rows of example indices out (no torch, no datasets).

    _strategies.py    best-fit / first-fit decreasing and next-fit over integer lengths
    _segments.py      Segments: the one representation of rows (example, skip, length, row offsets)
    _pack_lengths.py  pack_lengths and its PackingResult (Segments + what was truncated, dropped)
    _stats.py         the statistics vocabulary: efficiency, lower bound, PackStats

``check_not_too_long`` is re-exported from ``packing_collators._validation`` (its home).

Every other concept (collate, offline, sampler, trainer, cli) builds on this one; it imports
none of them.
"""

from ._pack_lengths import (
    OVERFLOW_FIX,
    WHOLE_EXAMPLES,
    Overflow,
    PackingResult,
    Strategy,
    check_not_too_long,
    pack_lengths,
)
from ._segments import Segments
from ._stats import PackStats, RowMeasures, efficiency, lower_bound, over_lower_bound

__all__ = [
    "OVERFLOW_FIX",
    "Overflow",
    "PackStats",
    "PackingResult",
    "RowMeasures",
    "Segments",
    "Strategy",
    "WHOLE_EXAMPLES",
    "check_not_too_long",
    "efficiency",
    "lower_bound",
    "over_lower_bound",
    "pack_lengths",
]
