"""The statistics vocabulary of every packing: efficiency, the lower bound, and what was lost.

    efficiency  = packed_tokens / (rows * capacity)        1.0 when every slot holds a real token
    lower bound = ceil(packed_tokens / capacity) rows       no packing of those tokens has fewer

:func:`efficiency` and :func:`lower_bound` are the one place these are computed (the
engine's :class:`PackingResult`, :class:`PackStats`, the sampler's epoch plan and the
CLI's analysis all call them), :class:`PackStats` holds the one vocabulary (``packed_examples``,
``packed_tokens``, ``dropped_examples`` for examples over the capacity, ``truncated_*``,
``empty_examples``, ``split_examples``, ``rows``, ``lower_bound_rows``, ``rows_over_lower_bound``,
``efficiency``), and :meth:`PackStats.summary` is the one wording of a packing in a log.
This module imports nothing else of the engine. A streaming packing adds its buffers' statistics up as it goes
(:meth:`PackStats.add`) and starts a new split with :meth:`PackStats.reset`.
Cost: constant per call.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["PackStats", "RowMeasures", "efficiency", "lower_bound", "over_lower_bound"]


def efficiency(tokens: int, slots: int) -> float:
    """Real tokens over the slots that hold them (``rows * capacity``); 1.0 for no slots.

    >>> efficiency(15, 2 * 8)
    0.9375
    """
    return tokens / slots if slots else 1.0


def lower_bound(tokens: int, capacity: int) -> int:
    """``ceil(tokens / capacity)``: the fewest rows (or batches) of ``capacity`` that hold ``tokens``.

    >>> lower_bound(15, 8)
    2
    """
    return math.ceil(tokens / capacity)


def over_lower_bound(rows: int, bound: int) -> float:
    """How many more rows than the lower bound, as a fraction (0.0 is optimal).

    >>> over_lower_bound(3, 2)
    0.5
    """
    return rows / bound - 1 if bound else 0.0


class RowMeasures:
    """``efficiency``, ``lower_bound_rows`` and ``rows_over_lower_bound`` of anything packed into rows.

    A class that has ``capacity`` and says which of its numbers are the packed tokens and the
    rows (``_tokens_and_rows``) gets the three measures, computed by the functions above.
    """

    capacity: int

    def _tokens_and_rows(self) -> tuple[int, int]:
        raise NotImplementedError

    @property
    def efficiency(self) -> float:
        """packed tokens / (rows * capacity); 1.0 for no rows."""
        tokens, rows = self._tokens_and_rows()
        return efficiency(tokens, rows * self.capacity)

    @property
    def lower_bound_rows(self) -> int:
        """ceil(packed tokens / capacity): no packing of these tokens has fewer rows."""
        return lower_bound(self._tokens_and_rows()[0], self.capacity)

    @property
    def rows_over_lower_bound(self) -> float:
        """How many more rows than the lower bound, as a fraction (0.0 is optimal)."""
        return over_lower_bound(self._tokens_and_rows()[1], self.lower_bound_rows)


@dataclass
class PackStats(RowMeasures):
    """Statistics of one packing (one split, or a whole stream).

    Attributes:
        strategy: the packing strategy.
        capacity: tokens per row (``max_length``).
        examples: examples read.
        rows: packed rows written.
        packed_examples: examples with tokens in some row (each counted once, also when split).
        input_tokens: tokens in all examples read.
        packed_tokens: tokens in the rows.
        truncated_examples / truncated_tokens: examples cut to ``capacity`` and the tokens cut off.
        dropped_examples / dropped_tokens: examples left out for being longer than ``capacity``.
        empty_examples: zero-length examples (in no row).
        split_examples: examples whose tokens span two or more rows (``"wrapped"``, or ``overflow="split"``).

    >>> from packing_collators import pack_lengths
    >>> stats = PackStats.from_result(pack_lengths([5, 2, 4, 1, 3], capacity=8))
    >>> stats.rows, stats.lower_bound_rows, stats.efficiency
    (2, 2, 0.9375)
    >>> stats.summary()
    'bfd: 2 rows (lower bound 2, +0.00%) of 8 tokens, efficiency 93.75%; 5 examples, 15 of 15 tokens packed; truncated 0 (0 tokens), dropped 0 (0 tokens), empty 0'
    """

    strategy: str
    capacity: int
    examples: int = 0
    rows: int = 0
    packed_examples: int = 0
    input_tokens: int = 0
    packed_tokens: int = 0
    truncated_examples: int = 0
    truncated_tokens: int = 0
    dropped_examples: int = 0
    dropped_tokens: int = 0
    empty_examples: int = 0
    split_examples: int = 0

    @classmethod
    def from_result(cls, result: Any, *, rows: int | None = None, packed_tokens: int | None = None) -> PackStats:
        """The statistics of an engine result (of all its rows unless ``rows``/``packed_tokens`` say otherwise).

        The same as ``result.pack_stats(rows=..., packed_tokens=...)``, which builds them.
        """
        return result.pack_stats(rows=rows, packed_tokens=packed_tokens)

    def _tokens_and_rows(self) -> tuple[int, int]:
        return self.packed_tokens, self.rows

    def add(self, other: PackStats) -> None:
        """Add another packing's counts to these (streaming: one buffer at a time)."""
        for f in fields(self):
            if f.type in ("int", int) and f.name != "capacity":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def reset(self) -> None:
        """Zero every count (a stream starting a new split keeps its strategy and capacity).

        >>> stats = PackStats("bfd", 8, rows=3, packed_tokens=20)
        >>> stats.reset()
        >>> stats.rows, stats.packed_tokens, stats.capacity
        (0, 0, 8)
        """
        for f in fields(self):
            if f.type in ("int", int) and f.name != "capacity":
                setattr(self, f.name, 0)

    def as_dict(self) -> dict:
        """Every count plus ``lower_bound_rows``, ``rows_over_lower_bound`` and ``efficiency``, as a plain dict (for JSON)."""
        return {
            **asdict(self),
            "lower_bound_rows": self.lower_bound_rows,
            "rows_over_lower_bound": self.rows_over_lower_bound,
            "efficiency": self.efficiency,
        }

    def summary(self) -> str:
        """One line for a log."""
        text = (
            f"{self.strategy}: {self.rows} rows (lower bound {self.lower_bound_rows}, "
            f"+{self.rows_over_lower_bound:.2%}) of {self.capacity} tokens, efficiency {self.efficiency:.2%}; "
            f"{self.examples} examples, {self.packed_tokens} of {self.input_tokens} tokens packed; "
            f"truncated {self.truncated_examples} ({self.truncated_tokens} tokens), "
            f"dropped {self.dropped_examples} ({self.dropped_tokens} tokens), empty {self.empty_examples}"
        )
        if self.split_examples:
            text += f", split across rows {self.split_examples}"
        return text

