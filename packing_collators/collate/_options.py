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

from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from .._validation import validate_choice, validate_positive_int
from ..batch import PACKING_KEYS, segment_layout
from ._buckets import bucket_length, validate_buckets
from ._concat import TokenFeatures
from ._flat_row import flat_batch

__all__ = ["CollateOptions", "Mode", "PrePackedOptions", "ReturnTensors", "to_tensors"]

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

    def flat_batch(self, tokens: TokenFeatures, lengths: np.ndarray) -> dict[str, Any]:
        """One flat row of ``tokens`` in segments of ``lengths`` with these options: padded to ``pad_to_multiple_of``,
        then to the smallest of ``pad_to_buckets`` that holds it (one padding segment); numpy.

        >>> tokens = TokenFeatures(np.array([5, 6, 7]), np.array([5, 6, 7]), {"token_type_ids": np.array([1, 1, 1])})
        >>> batch = CollateOptions(pad_to_multiple_of=4).flat_batch(tokens, np.array([3]))
        >>> batch["input_ids"].tolist(), batch["token_type_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
        ([[5, 6, 7, 0]], [[1, 1, 1, 0]], [0, 3, 4])
        """
        layout = segment_layout(lengths).padded_to(self.padded_length(len(tokens.input_ids)))
        return flat_batch(
            tokens,
            layout,
            pad_token_id=self.pad_token_id,
            position_ids_start=self.position_ids_start,
            label_pad_id=self.label_pad_id,
            return_seq_idx=self.return_seq_idx,
        )

    def padded_length(self, total: int) -> int:
        """The length a row of ``total`` tokens is padded to: a multiple of ``pad_to_multiple_of``, then a bucket.

        >>> CollateOptions(pad_to_multiple_of=8).padded_length(13), CollateOptions(pad_to_buckets=[16, 32]).padded_length(17)
        (16, 32)
        """
        multiple = self.pad_to_multiple_of
        padded = -(-total // multiple) * multiple if multiple else total
        return padded if self.pad_to_buckets is None else bucket_length(padded, self.pad_to_buckets)

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
        if name in _NOT_PER_EXAMPLE or name in PACKING_KEYS:
            raise ValueError(
                f"keep_columns cannot name {name!r}: PrePackedCollator reads or writes it itself (keep_columns are "
                "the per-example columns pack_dataset kept, one value per example in each row)."
            )
    return names


def to_tensors(batch: dict[str, Any], return_tensors: str) -> dict[str, Any]:
    """numpy arrays to torch tensors (zero-copy) when ``return_tensors == "pt"``."""
    if return_tensors == "np":
        return batch
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
