"""What the collators read from a batch's features: its columns, checked for shape, before any value is read.

Every key of every example is looked at (the union of their keys), and each is either read or refused::

    input_ids                     [[5, 6, 7], [8, 9]]       lengths [3, 2]: every other column is checked against them
    labels                        [[-100, 6, 7], [8, 9]]    read (every example, or none, has them)
    attention_mask                [[1, 1, 1], None]         read: all ones wherever given, checked by its values
    position_ids                  [[0, 1, 2], [0, 1]]       dropped (the collators rebuild them)
    token_type_ids (any other)    [[0, 0, 1], [1, 1]]       per token: carried like input_ids
    source, idx (not per token)   ["web", "math"]           ValueError: Example 0: 'source' is 'web' (str), ...
    cu_seq_lens_q, seq_idx, ...                             ValueError: the collator writes them itself
    a key whose value is None                               skipped for that example

For features ``[{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9]}]``::

    feature_column(features, "input_ids")   [[5, 6, 7], [8, 9]]
    read_columns(features, ...)             ValueError: Example 1 has no 'labels' but example 0 has ...
    check_same_lengths([3, 1], [3, 2], "labels")   ValueError: Example 1: labels has 1 tokens but input_ids has 2 ...

The columns' values are then laid end to end and checked as integers, once, by ``_concat.py``.
Every check names the example (or row), the key, the value and the fix. Cost: one pass over the
keys per example and a ``len`` per value; no token is read here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..batch import PACKING_KEYS

__all__ = ["Columns", "check_same_lengths", "feature_column", "read_columns", "sequence_lengths"]


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


def sequence_lengths(sequences: Sequence[Any], *, what: str = "input_ids", item: str = "Example") -> np.ndarray:
    """int64 (n,) length of each sequence, or an error naming the first that is not 1-D.

    >>> sequence_lengths([[1, 2, 3], np.array([4, 5])]).tolist()
    [3, 2]
    """
    try:
        return np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    except TypeError:
        pass
    for i, seq in enumerate(sequences):
        shape = getattr(seq, "shape", None)
        if shape is not None and len(shape) != 1:
            raise ValueError(f"{item} {i}: {what} must be one-dimensional, got shape {tuple(shape)}.")
        if not hasattr(seq, "__len__"):
            raise TypeError(
                f"{item} {i}: {what} must be a list, numpy array or tensor of token ids, got {type(seq).__name__}."
            )
    raise TypeError(f"{what} must be a sequence of token sequences.")


@dataclass(frozen=True)
class Columns:
    """A batch's columns, checked for shape: each a list of one value per example (``masks``: None where an
    example has none), and ``lengths``, int64 (n,), the examples' input_ids lengths."""

    lengths: np.ndarray
    input_ids: list
    labels: list | None = None
    masks: list | None = None
    carried: dict[str, list] = field(default_factory=dict)
    item: str = "Example"


def read_columns(
    features: Sequence[Mapping[str, Any]], *, collator: str, item: str = "Example", own: Sequence[str] = ()
) -> Columns:
    """Every key of every example: ``input_ids``, ``labels``, ``attention_mask`` and the per-token keys to carry.

    ``own`` names keys the caller reads itself. Refused here: a key the collator writes, one some examples
    lack, one that is not one entry per token, a value of another length than the example's input_ids.

    >>> columns = read_columns([{"input_ids": [5, 6], "token_type_ids": [0, 1]}, {"input_ids": [7], "token_type_ids": [1]}],
    ...                        collator="FlatteningCollator")
    >>> columns.lengths.tolist(), columns.labels, columns.carried
    ([2, 1], None, {'token_type_ids': [[0, 1], [1]]})
    >>> read_columns([{"input_ids": [5, 6], "idx": 3}], collator="FlatteningCollator")
    Traceback (most recent call last):
    ...
    ValueError: Example 0: 'idx' is 3 (int), not a list with one entry per token (input_ids has 2 tokens). FlatteningCollator carries only per-token keys; remove this column before collating: remove_unused_columns=True (the Trainer's default) drops the columns the model does not take, or dataset.remove_columns(['idx']).
    """
    input_ids = feature_column(features, "input_ids")
    lengths = sequence_lengths(input_ids, item=item)
    labels, masks, carried = None, None, {}
    for key in sorted(set().union(*features), key=str):  # every example's keys, not only the first one's
        if key in ("input_ids", "position_ids", *own):
            continue  # read by the caller, or rebuilt
        values = [feature.get(key) for feature in features]
        given = [i for i, value in enumerate(values) if value is not None]
        if not given:
            continue
        _refuse_written_keys(key, given[0], collator, item)
        if key == "attention_mask":  # an example without one has no padding
            masks = values
            present = sequence_lengths([values[i] for i in given], what=key, item=item)
            check_same_lengths(present, lengths[given], key, item=item, examples=given)
            continue
        if key == "labels":
            _refuse_missing(key, values, given, item)
            check_same_lengths(sequence_lengths(values, what="labels", item=item), lengths, "labels", item=item)
            labels = values
            continue
        _check_per_token(values, given, key, lengths, collator, item)
        _refuse_missing(key, values, given, item)
        carried[key] = values
    return Columns(lengths, input_ids, labels, masks, carried, item)


def _refuse_written_keys(key: str, index: int, collator: str, item: str) -> None:
    if key in PACKING_KEYS:
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


def check_same_lengths(
    other: np.ndarray, lengths: np.ndarray, key: str, item: str = "Example", examples: Sequence[int] | None = None
) -> None:
    """Raise a ValueError naming the first example whose ``key`` is not as long as its input_ids (``examples``: the
    indices of ``other``'s entries, when only some examples have ``key``).

    >>> check_same_lengths(np.array([3, 1]), np.array([3, 2]), "labels")
    Traceback (most recent call last):
    ...
    ValueError: Example 1: labels has 1 tokens but input_ids has 2; they must be the same length.
    """
    bad = np.flatnonzero(other != lengths)
    if len(bad):
        i = int(bad[0])
        index = i if examples is None else examples[i]
        raise ValueError(
            f"{item} {index}: {key} has {other[i]} tokens but input_ids has {lengths[i]}; they must be the same length."
        )

