"""Each collator's options as one frozen keyword-only dataclass, validated once when it is built.

    CollateOptions(pad_to_multiple_of=None, pad_token_id=0, return_tensors="pt",      FlatteningCollator
                   position_ids_start=0, return_seq_idx=False, label_pad_id=-100,
                   disable_cache=True, pad_to_buckets=None)
    PrePackedOptions(mode="flatten", max_length=None, <the same>)                      PrePackedCollator

:class:`FlatteningCollator` and :class:`PrePackedCollator` take these as keyword arguments
(so ``help()`` lists them), build their options object from them, and keep it as ``collator.options``.
Cost: constant, at construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from .._validation import validate_choice, validate_positive_int
from ._buckets import bucket_length, validate_buckets
from ._features import to_tensors
from ._flat_row import flat_batch, pad_to_multiple
from ._segments import segment_layout

__all__ = ["CollateOptions", "Mode", "PrePackedOptions", "ReturnTensors"]

ReturnTensors = Literal["pt", "np"]
Mode = Literal["flatten", "pad"]


@dataclass(frozen=True, kw_only=True)
class CollateOptions:
    """Validated collator options (see :class:`FlatteningCollator` for what each does).

    >>> CollateOptions(pad_to_multiple_of=8).pad_to_multiple_of
    8
    >>> CollateOptions(return_tensors="tf")
    Traceback (most recent call last):
    ...
    ValueError: return_tensors='tf' is not supported; choose one of 'pt', 'np'.
    """

    pad_to_multiple_of: int | None = None
    pad_token_id: int = 0
    return_tensors: ReturnTensors = "pt"
    position_ids_start: int = 0
    return_seq_idx: bool = False
    label_pad_id: int = -100
    disable_cache: bool = True
    pad_to_buckets: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.disable_cache, bool):
            raise TypeError(f"disable_cache must be True or False, got {self.disable_cache!r}.")
        validate_choice("return_tensors", self.return_tensors, ReturnTensors)
        validate_positive_int("pad_to_multiple_of", self.pad_to_multiple_of, allow_none=True)
        buckets = validate_buckets(self.pad_to_buckets, multiple_of=self.pad_to_multiple_of)
        object.__setattr__(self, "pad_to_buckets", buckets)  # sorted tuple

    def finish(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch as returned: tensors (``return_tensors``), and ``use_cache=False`` last (``disable_cache``).

        A causal LM whose config keeps transformers' default ``use_cache=True`` builds a KV cache
        in every forward, training included, and with a cache transformers stops detecting packed
        sequences: under sdpa/eager/flex the examples of a flat row would attend to each other.
        ``use_cache=False`` in the batch turns the cache off for that call, whatever the config says.

        >>> CollateOptions(return_tensors="np").finish({"input_ids": np.array([[5, 6]])})
        {'input_ids': array([[5, 6]]), 'use_cache': False}
        """
        batch = to_tensors(batch, self.return_tensors)
        if self.disable_cache:
            batch["use_cache"] = False
        return batch

    def flat_batch(
        self,
        input_ids: np.ndarray,
        labels: np.ndarray,
        segments: np.ndarray,
        carried: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """One flat row of these segments with these options: padded to ``pad_to_multiple_of``, then to
        the smallest of ``pad_to_buckets`` that holds it; numpy.

        ``carried`` per-token keys (int64 (T,) each) come back as int64 (1, T), 0 in the padding.

        >>> batch = CollateOptions(pad_to_multiple_of=4).flat_batch(
        ...     np.array([5, 6, 7]), np.array([5, 6, 7]), np.array([3]), {"token_type_ids": np.array([1, 1, 1])})
        >>> batch["input_ids"].tolist(), batch["token_type_ids"].tolist()
        ([[5, 6, 7, 0]], [[1, 1, 1, 0]])
        """
        total = len(input_ids)
        input_ids, labels, segments = pad_to_multiple(
            input_ids, labels, segments, self._padded_length(total), self.pad_token_id, self.label_pad_id
        )
        batch = flat_batch(
            input_ids,
            labels,
            segment_layout(segments),
            position_ids_start=self.position_ids_start,
            label_pad_id=self.label_pad_id,
            return_seq_idx=self.return_seq_idx,
        )
        padding = np.zeros(len(input_ids) - total, np.int64)
        for key, values in (carried or {}).items():
            batch[key] = np.concatenate([values, padding])[None] if len(padding) else values[None]
        return batch

    def _padded_length(self, total: int) -> int | None:
        """What ``pad_to_multiple`` pads a row of ``total`` tokens to a multiple of: one padding segment at most."""
        multiple = self.pad_to_multiple_of
        if self.pad_to_buckets is None:
            return multiple
        return bucket_length(-(-total // multiple) * multiple if multiple else total, self.pad_to_buckets)

    def keywords(self) -> str:
        """The shared options as ``name=value`` keywords, for a collator's ``repr``."""
        return ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(CollateOptions))


@dataclass(frozen=True, kw_only=True)
class PrePackedOptions(CollateOptions):
    """:class:`PrePackedCollator`'s options: the shared ones plus ``mode`` and ``max_length``, validated together.

    >>> PrePackedOptions(mode="pad", max_length=6).max_length
    6
    >>> PrePackedOptions(mode="pad")
    Traceback (most recent call last):
    ...
    ValueError: mode='pad' needs max_length (the packed rows' width, e.g. pack_dataset's max_length).
    """

    mode: Mode = "flatten"
    max_length: int | None = None
    keep_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_choice("mode", self.mode, Mode)
        super().__post_init__()
        object.__setattr__(self, "keep_columns", _kept_names(self.keep_columns))
        validate_positive_int("max_length", self.max_length, allow_none=True)
        if self.mode == "pad" and self.max_length is None:
            raise ValueError("mode='pad' needs max_length (the packed rows' width, e.g. pack_dataset's max_length).")
        if self.mode == "pad" and self.pad_to_multiple_of is not None:
            raise ValueError("pad_to_multiple_of is for mode='flatten'; with mode='pad' every row is max_length wide.")


# keys a row's tokens or the collator itself own: never one value per example
_NOT_PER_EXAMPLE = ("input_ids", "labels", "seq_lengths", "position_ids", "attention_mask", "use_cache")


def _kept_names(keep_columns) -> tuple[str, ...]:
    """``keep_columns`` as a tuple of names (one name may be given as a string), each one a row may carry.

    >>> _kept_names("source"), _kept_names(["source", "id"])
    (('source',), ('source', 'id'))
    >>> _kept_names(["labels"])
    Traceback (most recent call last):
    ...
    ValueError: keep_columns cannot name 'labels': PrePackedCollator reads or writes it itself (keep_columns are the per-example columns pack_dataset kept, one value per example in each row).
    """
    names = (keep_columns,) if isinstance(keep_columns, str) else tuple(keep_columns)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"keep_columns must hold column names (strings), got {name!r}.")
        if name in _NOT_PER_EXAMPLE or name.startswith(("cu_seq_lens", "max_length_")) or name == "seq_idx":
            raise ValueError(
                f"keep_columns cannot name {name!r}: PrePackedCollator reads or writes it itself (keep_columns are "
                "the per-example columns pack_dataset kept, one value per example in each row)."
            )
    return names
