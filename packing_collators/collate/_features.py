"""What the collators read from a batch's features, checked: columns, lengths, padding, tensors.

Every key of every example is looked at (the union of their keys), and each is either read or refused::

    input_ids                     [[5, 6, 7], [8, 9]]       concatenated: int64 (T,)
    labels                        [[-100, 6, 7], [8, 9]]    concatenated (every example, or none, has them)
    attention_mask                [[1, 1, 1], None]         checked all ones wherever given (check_unpadded,
                                                            in _validation.py), then dropped
    position_ids                  [[0, 1, 2], [0, 1]]       dropped (the collators rebuild them)
    token_type_ids (any other)    [[0, 0, 1], [1, 1]]       per token: concatenated like input_ids, int64 (T,)
    source, idx (not per token)   ["web", "math"]           ValueError: Example 0: 'source' is 'web' (str), ...
    a key whose value is None                               skipped for that example

For features ``[{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9]}]``::

    feature_column(features, "input_ids")   [[5, 6, 7], [8, 9]]
    read_token_features(features, ...)      ValueError: Example 1 has no 'labels' but example 0 has ...
    check_same_lengths([3, 1], [3, 2], "labels")   ValueError: Example 1: labels has 1 tokens but input_ids has 2 ...

Every check names the example (or row), the key, the value and the fix. Cost: one pass
over the keys per example and vectorised numpy over the tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_unpadded
from ._concat import check_non_negative, concat_tokens, sequence_lengths

__all__ = [
    "TokenFeatures",
    "check_same_lengths",
    "check_unpadded",
    "feature_column",
    "mask_zero_owners",
    "read_token_features",
    "to_tensors",
]

# keys the collators write into a batch, so an example may not bring its own
WRITTEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def feature_column(features: Sequence[Mapping[str, Any]], key: str) -> list:
    """The values of ``key`` in every example, or an error naming the first example without it.

    >>> feature_column([{"input_ids": [1, 2]}, {"input_ids": [3]}], "input_ids")
    [[1, 2], [3]]
    """
    try:
        return [feature[key] for feature in features]
    except KeyError:
        missing = next(i for i, feature in enumerate(features) if key not in feature)
        raise ValueError(
            f"Example {missing} has no {key!r} (its keys: {sorted(features[missing])}); "
            f"every example in a batch needs {key!r} when the first one has it."
        ) from None


@dataclass(frozen=True)
class TokenFeatures:
    """A batch's per-token features laid end to end: ``input_ids``, ``labels`` and the ``carried`` keys, int64 (T,) each."""

    input_ids: np.ndarray
    labels: np.ndarray
    carried: dict[str, np.ndarray]


def read_token_features(
    features: Sequence[Mapping[str, Any]],
    lengths: np.ndarray,
    *,
    collator: str,
    item: str = "Example",
    own: Sequence[str] = (),
) -> TokenFeatures:
    """Read every key of every example: ``input_ids``, ``labels`` and the per-token keys to carry.

    ``lengths`` are the examples' input_ids lengths; ``own`` names keys the caller reads itself.
    An example without labels gets labels = input_ids only when no example has labels.

    >>> tokens = read_token_features([{"input_ids": [5, 6], "token_type_ids": [0, 1]}, {"input_ids": [7], "token_type_ids": [1]}],
    ...                              np.array([2, 1]), collator="FlatteningCollator")
    >>> tokens.input_ids.tolist(), tokens.labels.tolist(), {k: v.tolist() for k, v in tokens.carried.items()}
    ([5, 6, 7], [5, 6, 7], {'token_type_ids': [0, 1, 1]})
    >>> read_token_features([{"input_ids": [5, 6], "idx": 3}], np.array([2]), collator="FlatteningCollator")
    Traceback (most recent call last):
    ...
    ValueError: Example 0: 'idx' is 3 (int), not a list with one entry per token (input_ids has 2 tokens). FlatteningCollator carries only per-token keys; remove this column before collating: remove_unused_columns=True (the Trainer's default) drops the columns the model does not take, or dataset.remove_columns(['idx']).
    """
    total = int(lengths.sum())
    input_ids = concat_tokens(feature_column(features, "input_ids"), total, item=item)
    check_non_negative(input_ids, lengths, item=item)
    labels, carried = None, {}
    for key in sorted(set().union(*features), key=str):  # every example's keys, not only the first one's
        if key in ("input_ids", "position_ids", *own):
            continue  # read by the caller, or rebuilt
        values = [feature.get(key) for feature in features]
        given = [i for i, value in enumerate(values) if value is not None]
        if not given:
            continue
        _refuse_written_keys(key, given[0], collator, item)
        if key == "attention_mask":
            check_unpadded(mask_zero_owners(features, lengths, item=item), len(features), item=item)
        elif key == "labels":
            _refuse_missing(key, values, given, item)
            check_same_lengths(sequence_lengths(values, what="labels", item=item), lengths, "labels", item=item)
            labels = concat_tokens(values, total, what="labels", item=item)
        else:
            _check_per_token(values, given, key, lengths, collator, item)
            _refuse_missing(key, values, given, item)
            carried[key] = _read_carried(values, total, key, collator, item)
    return TokenFeatures(input_ids, input_ids.copy() if labels is None else labels, carried)


def _read_carried(values: list, total: int, key: str, collator: str, item: str) -> np.ndarray:
    """A per-token key laid end to end as int64 (total,); integers or bools only, like the tokens."""
    try:
        return concat_tokens(values, total, what=key, item=item, allow_bool=True)
    except TypeError as error:
        raise TypeError(
            f"{error} {collator} carries per-token keys as int64; if {key!r} holds other values (weights, text), "
            f"remove it before collating (dataset.remove_columns([{key!r}]))."
        ) from None


def _refuse_written_keys(key: str, index: int, collator: str, item: str) -> None:
    if key in WRITTEN_KEYS:
        raise ValueError(
            f"{item} {index} has {key!r}, which {collator} writes itself; remove it before collating "
            f"(dataset.remove_columns([{key!r}]))."
        )
    if key == "seq_lengths":
        raise ValueError(
            f"{item} {index} has 'seq_lengths': the dataset looks pre-packed (rows of pack_dataset, several examples "
            f"each), and {collator} would train each row as one example. Collate pre-packed rows with "
            "PrePackedCollator, or train on the unpacked dataset."
        )


def _refuse_missing(key: str, values: list, given: list[int], item: str) -> None:
    """Refuse a key that some examples have and others lack: no value could stand in for theirs."""
    if len(given) == len(values):
        return
    missing, first_given = next(i for i, value in enumerate(values) if value is None), given[0]
    fix = (
        "labels (e.g. labels = input_ids where every token is a target), or none"
        if key == "labels"
        else f"{key}, or none (dataset.remove_columns([{key!r}]))"
    )
    raise ValueError(
        f"{item} {missing} has no {key!r} but {item.lower()} {first_given} has; a batch cannot mix them. "
        f"Give every {item.lower()} {fix}."
    )


def _check_per_token(values: list, given: list[int], key: str, lengths: np.ndarray, collator: str, item: str) -> None:
    """Refuse a key that is not one entry per token (a scalar, a string, another length), naming the fix."""
    if collator == "PrePackedCollator":
        fix = (
            f"PrePackedCollator carries per-token keys, and the per-example ones it is told to. Training needs "
            f"neither: remove it before collating (dataset.remove_columns([{key!r}]), or remove_unused_columns=True "
            f"with PackingTrainer, which keeps seq_lengths). If {key!r} holds one value per example (pack_dataset's "
            f"keep_columns, the command line's --keep-column) and you use it, pass "
            f"PrePackedCollator(keep_columns=[{key!r}]) and take it out of the batch before model(**batch)."
        )
    else:
        fix = (
            f"{collator} carries only per-token keys; remove this column before collating: remove_unused_columns=True "
            f"(the Trainer's default) drops the columns the model does not take, or dataset.remove_columns([{key!r}])."
        )
    for i in given:  # one step per example
        value, n = values[i], int(lengths[i])
        shape = getattr(value, "shape", None)
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or shape == ():
            shown = repr(value) if isinstance(value, (str, bytes)) else str(value)
            raise ValueError(
                f"{item} {i}: {key!r} is {shown[:50]} ({type(value).__name__}), not a list with one entry per token "
                f"(input_ids has {n} tokens). {fix}"
            )
        if shape is not None and len(shape) != 1:
            raise ValueError(
                f"{item} {i}: {key!r} has shape {tuple(shape)}, not one entry per token (input_ids has {n} tokens). {fix}"
            )
        if len(value) != n:
            raise ValueError(
                f"{item} {i}: {key!r} has {len(value)} entries but input_ids has {n} tokens, so it is not one entry "
                f"per token (if it should be, fix its length). {fix}"
            )


def mask_zero_owners(
    features: Sequence[Mapping[str, Any]], lengths: np.ndarray, *, item: str = "Example"
) -> np.ndarray:
    """int64, one entry per ``attention_mask`` zero: the example holding it (ascending), for :func:`check_unpadded`.

    Every example that has an attention_mask is read (its length checked against input_ids);
    one without it (or with None) has no padding.

    >>> mask_zero_owners([{"input_ids": [1, 2]}, {"input_ids": [3, 0, 0], "attention_mask": [1, 0, 0]}], np.array([2, 3])).tolist()
    [1, 1]
    >>> check_unpadded(mask_zero_owners([{"input_ids": [3, 0], "attention_mask": [1, 0]}], np.array([2])), 1)
    Traceback (most recent call last):
    ...
    ValueError: Example 0 is padded: its attention_mask has 1 zero(s) (1 of 1 examples have attention_mask zeros). Example 0 has attention_mask zeros inside it, so packing would put its pad tokens into rows and train on them. Tokenize with padding=False, or strip the padding first (keep the tokens where attention_mask is 1).
    """
    masks = [feature.get("attention_mask") for feature in features]
    if not any(mask is not None for mask in masks):
        return np.empty(0, np.int64)
    masks = [np.ones(n, np.int64) if mask is None else mask for mask, n in zip(masks, lengths.tolist())]
    mask_lengths = sequence_lengths(masks, what="attention_mask", item=item)
    check_same_lengths(mask_lengths, lengths, "attention_mask", item=item)
    flat = concat_tokens(masks, int(mask_lengths.sum()), what="attention_mask", item=item, allow_bool=True)
    return np.searchsorted(np.cumsum(lengths), np.flatnonzero(flat == 0), side="right").astype(np.int64)


def check_same_lengths(other: np.ndarray, lengths: np.ndarray, key: str, item: str = "Example") -> None:
    """Raise a ValueError naming the first example whose ``key`` is not as long as its input_ids.

    >>> check_same_lengths(np.array([3, 1]), np.array([3, 2]), "labels")
    Traceback (most recent call last):
    ...
    ValueError: Example 1: labels has 1 tokens but input_ids has 2; they must be the same length.
    """
    bad = np.flatnonzero(other != lengths)
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"{item} {i}: {key} has {other[i]} tokens but input_ids has {lengths[i]}; they must be the same length."
        )


def to_tensors(batch: dict[str, Any], return_tensors: str) -> dict[str, Any]:
    """numpy arrays to torch tensors (zero-copy) when ``return_tensors == "pt"``."""
    if return_tensors == "np":
        return batch
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
