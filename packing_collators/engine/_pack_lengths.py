"""The packing engine: example lengths in, rows of example indices out.

A packing of lengths ``[5, 2, 4, 1, 3]`` into rows of capacity 8 (best-fit decreasing)::

    row 0: indices [0, 4]     tokens  S0 S0 S0 S0 S0 S4 S4 S4    8/8
    row 1: indices [1, 2, 3]  tokens  S1 S1 S2 S2 S2 S2 S3 --    7/8

Rows hold example *indices*, listed in ascending (dataset) order within a row;
rows come in the order the strategy opened them. Cost: one sort of the lengths
plus, for ``"bfd"``, a loop over (length, free-space) classes that does not grow
with the number of examples (timed against TRL's packer by ``benchmarks/cpu/bench_engine.py``).

Examples longer than the capacity follow ``overflow``; zero-length examples are
never put in a row: they are listed in ``empty_indices`` and counted in the
statistics. No torch, transformers or datasets here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .._validation import check_not_too_long, validate_choice, validate_lengths, validate_positive_int
from ._segments import Segments
from ._stats import PackStats
from ._strategies import best_fit_decreasing, first_fit_decreasing, next_fit

__all__ = ["OVERFLOW_FIX", "Overflow", "PackingResult", "Strategy", "WHOLE_EXAMPLES", "check_not_too_long", "pack_lengths"]

Strategy = Literal["bfd", "ffd", "next_fit"]
Overflow = Literal["error", "truncate", "drop", "split"]
"""What a packer does with an example longer than its budget, the one type every packer takes:
``"error"`` (every packer's default) names the example and the fix, ``"truncate"`` keeps its
first tokens, ``"drop"`` leaves it out (counted), ``"split"`` keeps every token, in pieces.
Each packer accepts the values it can honour (docs/engine.md, "One name per concept")."""

WHOLE_EXAMPLES: tuple[str, ...] = ("error", "truncate", "drop")
"""The ``Overflow`` values of a packer that keeps each example in one row (all but ``"split"``)."""

_STRATEGIES = {"bfd": best_fit_decreasing, "ffd": first_fit_decreasing, "next_fit": next_fit}
# What to do about an example over the capacity (the engine's, and the packers' built on it).
OVERFLOW_FIX = "Pass overflow='truncate' or overflow='drop', or raise the capacity."


@dataclass(frozen=True, eq=False, init=False)
class PackingResult(Segments):
    """Rows of example indices, with what was truncated, dropped or empty.

    A :class:`Segments` of whole examples (every ``skip`` is 0): row ``r`` holds the examples
    ``example[row_offsets[r]:row_offsets[r+1]]`` and the tokens each of them contributes are
    ``length`` at the same positions (``capacity`` for a truncated example).

    Attributes:
        capacity: tokens per row.
        strategy: the strategy that made the rows.
        example: int64 (num_packed,) example indices, row after row.
        length: int64 (num_packed,) tokens of each packed example (after truncation).
        row_offsets: int64 (num_rows + 1,) where each row starts in ``example``.
        input_tokens: tokens in all examples given, before truncation or dropping.
        truncated_indices: examples cut to ``capacity`` tokens (``overflow="truncate"``).
        dropped_indices: examples left out for being too long (``overflow="drop"``).
        empty_indices: zero-length examples, which no row holds.

    >>> result = pack_lengths([5, 2, 4, 1, 3], capacity=8)
    >>> result.rows
    [[0, 4], [1, 2, 3]]
    >>> result.num_rows, result.total_tokens, result.lower_bound_rows, round(result.efficiency, 4)
    (2, 15, 2, 0.9375)
    """

    strategy: str
    input_tokens: int
    truncated_indices: np.ndarray
    dropped_indices: np.ndarray
    empty_indices: np.ndarray
    dropped_tokens: int

    def __init__(
        self,
        capacity: int,
        strategy: str,
        example: np.ndarray,
        length: np.ndarray,
        row_offsets: np.ndarray,
        input_tokens: int,
        truncated_indices: np.ndarray | None = None,
        dropped_indices: np.ndarray | None = None,
        empty_indices: np.ndarray | None = None,
        dropped_tokens: int = 0,
    ) -> None:
        super().__init__(capacity, example, np.zeros(len(example), np.int64), length, row_offsets)
        lost = {"truncated_indices": truncated_indices, "dropped_indices": dropped_indices, "empty_indices": empty_indices}
        for name, value in lost.items():
            object.__setattr__(self, name, np.empty(0, np.int64) if value is None else value)
        object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "input_tokens", input_tokens)
        object.__setattr__(self, "dropped_tokens", dropped_tokens)

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, row: int) -> list[int]:
        return self.row(row)

    def __iter__(self):
        return iter(self.rows)

    @property
    def num_truncated(self) -> int:
        return len(self.truncated_indices)

    @property
    def truncated_tokens(self) -> int:
        """Tokens cut off the ends of truncated examples."""
        return self.input_tokens - self.total_tokens - self.dropped_tokens

    @property
    def num_dropped(self) -> int:
        return len(self.dropped_indices)

    @property
    def num_empty(self) -> int:
        return len(self.empty_indices)

    def pack_stats(self, *, rows: int | None = None, packed_tokens: int | None = None) -> PackStats:
        """The :class:`PackStats` of these rows (of all of them unless ``rows``/``packed_tokens`` say otherwise).

        >>> pack_lengths([6, 0, 9, 2], capacity=8, overflow="drop").pack_stats().dropped_examples
        1
        """
        return PackStats(
            strategy=self.strategy,
            capacity=self.capacity,
            examples=self.num_segments + self.num_dropped + self.num_empty,
            rows=self.num_rows if rows is None else rows,
            packed_examples=self.num_segments,
            input_tokens=self.input_tokens,
            packed_tokens=self.total_tokens if packed_tokens is None else packed_tokens,
            truncated_examples=self.num_truncated,
            truncated_tokens=self.truncated_tokens,
            dropped_examples=self.num_dropped,
            dropped_tokens=self.dropped_tokens,
            empty_examples=self.num_empty,
        )

    def stats(self) -> dict:
        """The statistics as a plain dict (for logging or JSON): :meth:`PackStats.as_dict`, the one vocabulary.

        >>> stats = pack_lengths([5, 2, 4, 1, 3], capacity=8).stats()
        >>> stats["packed_examples"], stats["rows"], stats["lower_bound_rows"], stats["efficiency"]
        (5, 2, 2, 0.9375)
        """
        return self.pack_stats().as_dict()

    def summary(self) -> str:
        """One line for a log, worded as :meth:`PackStats.summary` (it is that summary).

        >>> pack_lengths([6, 0, 9, 2], capacity=8, overflow="truncate").summary()
        'bfd: 2 rows (lower bound 2, +0.00%) of 8 tokens, efficiency 100.00%; 4 examples, 16 of 17 tokens packed; truncated 1 (1 tokens), dropped 0 (0 tokens), empty 1'
        """
        return self.pack_stats().summary()


def pack_lengths(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    *,
    strategy: Strategy = "bfd",
    overflow: Overflow = "error",
) -> PackingResult:
    """Assign examples to rows of at most ``capacity`` tokens.

    Args:
        lengths: token count of each example (list or 1-D integer array).
        capacity: tokens per row (>= 1).
        strategy: ``"bfd"`` best-fit decreasing (default, tightest), ``"ffd"``
            first-fit decreasing, or ``"next_fit"`` (keeps dataset order: a row is
            closed when the next example does not fit).
        overflow: for an example longer than ``capacity``: ``"error"`` (default),
            ``"truncate"`` (keep its first ``capacity`` tokens, in a row of its own) or
            ``"drop"``. Both are counted on the result. (``"split"``: ``pack_dataset`` only.)

    Returns:
        A :class:`PackingResult`. Zero-length examples are in no row; they are
        listed in ``empty_indices``. The same input always gives the same rows.

    >>> pack_lengths([3, 2, 4, 3], capacity=8, strategy="next_fit").rows
    [[0, 1], [2, 3]]
    >>> pack_lengths([3, 12, 4], capacity=8)
    Traceback (most recent call last):
    ...
    ValueError: Example 1 has 12 tokens, more than capacity=8 (1 example(s) too long, the longest 12 tokens). Pass overflow='truncate' or overflow='drop', or raise the capacity.
    """
    validate_choice("strategy", strategy, Strategy)
    validate_choice("overflow", overflow, WHOLE_EXAMPLES)
    validate_positive_int("capacity", capacity)
    capacity = int(capacity)
    lengths = validate_lengths(lengths)
    if overflow == "error":
        check_not_too_long(lengths, capacity, limit_name="capacity", fix=OVERFLOW_FIX)
    too_long = lengths > capacity
    empty = np.flatnonzero(lengths == 0)
    keep = lengths > 0
    dropped = np.empty(0, np.int64)
    dropped_tokens = 0
    if overflow == "drop":
        dropped = np.flatnonzero(too_long)
        dropped_tokens = int(lengths[dropped].sum())
        keep &= ~too_long
    truncated = np.flatnonzero(too_long) if overflow == "truncate" else np.empty(0, np.int64)
    items = np.flatnonzero(keep)
    item_lengths = np.minimum(lengths[items], capacity)
    bin_of_item, num_bins = _STRATEGIES[strategy](item_lengths, capacity)
    if np.all(bin_of_item[1:] >= bin_of_item[:-1]):
        order = np.arange(len(items))  # next_fit: rows already in dataset order
    else:
        order = np.argsort(bin_of_item, kind="stable")  # keeps dataset order inside a row
    counts = np.bincount(bin_of_item, minlength=num_bins)
    return PackingResult(
        capacity=capacity,
        strategy=strategy,
        example=items[order],
        length=item_lengths[order],
        row_offsets=np.r_[0, np.cumsum(counts)].astype(np.int64),
        input_tokens=int(lengths.sum()),
        truncated_indices=truncated,
        dropped_indices=dropped,
        empty_indices=empty,
        dropped_tokens=dropped_tokens,
    )
