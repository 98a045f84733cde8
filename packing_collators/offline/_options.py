"""The options of :func:`pack_dataset`, validated once at entry: how to pack (``PackOptions``, shared by the
in-memory, on-disk and streaming packers) and where the rows of a ``Dataset`` go (``CacheOptions``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .._validation import validate_choice, validate_positive_int
from ..engine import Overflow

__all__ = ["CacheOptions", "DatasetStrategy", "MAX_LENGTH_FIX", "PackOptions", "SPLIT_FIX"]

DatasetStrategy = Literal["bfd", "ffd", "next_fit", "wrapped"]


MAX_LENGTH_FIX = "Pass overflow='truncate' or overflow='drop', or raise max_length."
"""The fix suggested for an example longer than ``max_length`` where ``"split"`` is not available (streams)."""

SPLIT_FIX = (
    "Pass overflow='split' (keep every token, in pieces), overflow='truncate' or overflow='drop', or raise max_length."
)
"""The fix :func:`pack_dataset` suggests for an example longer than ``max_length`` in a ``Dataset``."""


@dataclass(frozen=True)
class PackOptions:
    """Validated :func:`pack_dataset` options.

    ``num_shards`` / ``shard_index``: build only rows ``[i * R // N, (i + 1) * R // N)`` of the
    ``R`` rows of the whole packing (an ``array_split`` of the final, shuffled row order).

    >>> PackOptions(max_length=0)
    Traceback (most recent call last):
    ...
    ValueError: max_length must be a positive integer, got 0.
    >>> PackOptions(max_length=8, strategy="best")
    Traceback (most recent call last):
    ...
    ValueError: strategy='best' is not supported; choose one of 'bfd', 'ffd', 'next_fit', 'wrapped'.
    >>> PackOptions(max_length=8, num_shards=4, shard_index=4)
    Traceback (most recent call last):
    ...
    ValueError: shard_index=4 is out of range for num_shards=4; shards are numbered 0 to 3.
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
    num_shards: int = 1
    shard_index: int = 0

    def __post_init__(self) -> None:
        validate_positive_int("max_length", self.max_length)
        validate_choice("strategy", self.strategy, DatasetStrategy)
        validate_choice("overflow", self.overflow, Overflow)
        validate_positive_int("num_proc", self.num_proc, allow_none=True)
        validate_positive_int("buffer_size", self.buffer_size)
        validate_positive_int("num_shards", self.num_shards)
        validate_positive_int("shard_index", self.shard_index, minimum=0)
        for name in ("max_length", "num_proc", "buffer_size", "num_shards", "shard_index"):
            if getattr(self, name) is not None:  # numpy integers become ints (for stats and JSON)
                object.__setattr__(self, name, int(getattr(self, name)))
        if self.shard_index >= self.num_shards:
            raise ValueError(
                f"shard_index={self.shard_index} is out of range for num_shards={self.num_shards}; shards are "
                f"numbered 0 to {self.num_shards - 1}."
            )
        if isinstance(self.keep_columns, str) or not all(isinstance(c, str) for c in self.keep_columns):
            raise TypeError(f"keep_columns must be a list of column names, got {self.keep_columns!r}.")
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))

    def output_key(self) -> dict:
        """The options that decide the packed rows (for fingerprints and caches): not ``num_proc`` nor ``progress``.

        >>> sorted(PackOptions(max_length=8).output_key())[:4]
        ['keep_columns', 'label_pad_id', 'max_length', 'num_shards']
        """
        skip = ("num_proc", "progress", "buffer_size")
        return {name: value for name, value in vars(self).items() if name not in skip}


@dataclass(frozen=True)
class CacheOptions:
    """Validated :func:`pack_dataset` cache options: where the packed rows of a ``Dataset`` go, and their reuse.

    ``cache_file_name``: one path, or (``DatasetDict``) a dict of split name to path; ``None``
    names the file by fingerprint beside the dataset's own. ``load_from_cache_file``: already
    resolved (``None`` given means whether ``datasets`` caching is on).

    >>> CacheOptions(cache_file_name={"train": "t.arrow"}).path_of("train"), CacheOptions().path_of("train")
    ('t.arrow', None)
    >>> CacheOptions(cache_file_name="rows.arrow", keep_in_memory=True)
    Traceback (most recent call last):
    ...
    ValueError: Pass keep_in_memory=True or cache_file_name='rows.arrow', not both: rows kept in memory are written to no file.
    """

    cache_file_name: str | Mapping[str, str] | None = None
    keep_in_memory: bool = False
    load_from_cache_file: bool = True

    def __post_init__(self) -> None:
        if self.keep_in_memory and self.cache_file_name is not None:  # as Dataset.map refuses it: one would be ignored
            raise ValueError(
                f"Pass keep_in_memory=True or cache_file_name={self.cache_file_name!r}, not both: rows kept in memory "
                "are written to no file."
            )

    @property
    def chosen(self) -> bool:
        """Whether a file or memory was asked for (a stream has neither)."""
        return self.cache_file_name is not None or self.keep_in_memory

    def path_of(self, split_name: str = "") -> str | None:
        """The path asked for this split (``cache_file_name``, or its entry for ``split_name``), else None."""
        if isinstance(self.cache_file_name, Mapping):
            return self.cache_file_name.get(split_name)
        return self.cache_file_name

    def check_splits(self, names) -> None:
        """A ``DatasetDict`` takes a dict of split name to path, not one path for all of its splits."""
        if isinstance(self.cache_file_name, str):
            raise ValueError(
                "cache_file_name for a DatasetDict is a dict of split name to path, e.g. "
                f"{ {name: f'packed-{name}.arrow' for name in names} }."
            )
