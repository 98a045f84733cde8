"""The options of :func:`pack_dataset`, validated once at entry and shared by the in-memory and streaming packers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._validation import validate_choice, validate_positive_int
from ..engine import Overflow

__all__ = ["DatasetStrategy", "MAX_LENGTH_FIX", "PackOptions"]

DatasetStrategy = Literal["bfd", "ffd", "next_fit", "wrapped"]

MAX_LENGTH_FIX = "Pass overflow='truncate' or overflow='drop', or raise max_length."
"""The fix :func:`pack_dataset` suggests for an example longer than ``max_length``."""


@dataclass(frozen=True)
class PackOptions:
    """Validated :func:`pack_dataset` options.

    >>> PackOptions(max_length=0)
    Traceback (most recent call last):
    ...
    ValueError: max_length must be a positive integer, got 0.
    >>> PackOptions(max_length=8, strategy="best")
    Traceback (most recent call last):
    ...
    ValueError: strategy='best' is not supported; choose one of 'bfd', 'ffd', 'next_fit', 'wrapped'.
    """

    max_length: int
    strategy: DatasetStrategy = "bfd"
    overflow: Overflow = "error"
    shuffle_rows: bool = True
    seed: int = 0
    keep_columns: tuple[str, ...] = ()
    label_pad_id: int = -100
    num_proc: int | None = None
    buffer_size: int = 10_000
    progress: bool | None = None

    def __post_init__(self) -> None:
        validate_positive_int("max_length", self.max_length)
        validate_choice("strategy", self.strategy, DatasetStrategy)
        validate_choice("overflow", self.overflow, Overflow)
        validate_positive_int("num_proc", self.num_proc, allow_none=True)
        validate_positive_int("buffer_size", self.buffer_size)
        for name in ("max_length", "num_proc", "buffer_size"):  # numpy integers become ints (for stats and JSON)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        if isinstance(self.keep_columns, str) or not all(isinstance(c, str) for c in self.keep_columns):
            raise TypeError(f"keep_columns must be a list of column names, got {self.keep_columns!r}.")
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
