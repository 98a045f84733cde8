"""A batch's columns laid end to end: each column's values in one flat int64 array, every value checked.

Every value is checked to be an integer, at the speed of a plain copy::

    concat_tokens([[1, 2], [3, 4]], 4)       [1, 2, 3, 4]        int64 (4,)
    concat_tokens([[1, 2], [3, 4.5]], 4)     TypeError: Example 1: ... got float 4.5 at position 1 ...
    token_features(columns)                  TokenFeatures: input_ids, labels, carried keys, int64 (T,) each;
                                             input_ids never negative, attention_mask all ones (else refused)

Lists (what a ``datasets.Dataset`` yields) are appended with ``array("q").fromlist``,
which converts each value like ``operator.index`` does, so a float, string or None
anywhere fails instead of being floored or parsed, at about 16 ns a token, no slower
than ``np.fromiter`` (which would silently turn ``2.7`` into ``2`` and ``"2"`` into ``2``).
numpy arrays and tensors are joined with one ``concatenate`` and checked by dtype.
Cost: one copy of the tokens; a Python loop only over examples, and over tokens only to
name the bad value once a check has failed.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_unpadded
from ._features import Columns

__all__ = ["TokenFeatures", "check_non_negative", "concat_tokens", "mask_zero_owners", "token_features"]

_INT64 = np.iinfo(np.int64)
_FIX = "Store them as integers: a float or a string here means the column was built wrong (look at the dataset's features)."
_BOOL_FIX = (
    "Booleans are not token ids (True and False would be read as ids 1 and 0): this looks like a mask in the wrong "
    "column. Store token ids as integers."
)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def concat_tokens(
    sequences: Sequence[Any], total: int, *, what: str = "input_ids", item: str = "Example", allow_bool: bool = False
) -> np.ndarray:
    """The sequences laid end to end as int64 (total,), every value checked to be an integer.

    Python ints and numpy or torch integers pass; a float (even ``2.0``), string or None
    anywhere is a TypeError naming the example, the position and the value. Booleans pass
    only with ``allow_bool`` (masks), as 0 and 1; without it a boolean array is refused by its
    dtype, and a Python list by its first and last value (``[True, False, True]`` is not token
    ids 1, 0, 1: it is a mask in the wrong column; a check of every value would double the cost).

    >>> concat_tokens([[1, 2], np.array([3]), [4, 5, 6]], 6).tolist()
    [1, 2, 3, 4, 5, 6]
    >>> concat_tokens([[1, 2], [3, 4.5]], 4, what="labels")
    Traceback (most recent call last):
    ...
    TypeError: Example 1: labels must hold integer token ids, got float 4.5 at position 1. Store them as integers: a float or a string here means the column was built wrong (look at the dataset's features).
    >>> concat_tokens([[5, 6], [True, False, True]], 5)
    Traceback (most recent call last):
    ...
    TypeError: Example 1: input_ids must hold integer token ids, got bool True at position 0. Booleans are not token ids (True and False would be read as ids 1 and 0): this looks like a mask in the wrong column. Store token ids as integers.
    """
    first = sequences[0] if len(sequences) else None
    if _is_tensor(first) or isinstance(first, np.ndarray):
        flat = _concat_arrays(sequences, what, item, allow_bool)
    else:
        flat = _concat_lists(sequences, what, item, allow_bool)
    if len(flat) != total:
        raise ValueError(f"{what} holds {len(flat)} tokens in all, not the {total} its lengths add up to.")
    return flat


def _concat_lists(sequences: Sequence[Any], what: str, item: str, allow_bool: bool) -> np.ndarray:
    """The fast path: ``fromlist`` per example, which refuses non-integers (arrays among them: by dtype)."""
    buffer = array("q")
    for i, seq in enumerate(sequences):  # one step per example, not per token
        if not allow_bool and _bool_at_ends(seq):
            pass  # booleans: refused below, value by value (fromlist would take them as 1 and 0)
        elif type(seq) is list:
            try:
                buffer.fromlist(seq)  # all or nothing: on an error it appends nothing
                continue
            except (TypeError, OverflowError):
                pass
        elif not (_is_tensor(seq) or isinstance(seq, np.ndarray)):
            size = len(buffer)
            try:
                buffer.extend(seq)  # a tuple: converted in C as well
                continue
            except (TypeError, OverflowError):
                del buffer[size:]  # extend may have appended part of it
        # an array, or values that are not all ints: by dtype, or value by value to name the bad one
        buffer.frombytes(_checked_array(seq, i, what, item, allow_bool).tobytes())
    return np.frombuffer(buffer, dtype=np.int64) if buffer else np.empty(0, np.int64)


def _bool_at_ends(seq: Any) -> bool:
    """Whether a list or tuple starts or ends with a bool: one look per example, not per token."""
    return type(seq) in (list, tuple) and len(seq) > 0 and (type(seq[0]) is bool or type(seq[-1]) is bool)


def _concat_arrays(sequences: Sequence[Any], what: str, item: str, allow_bool: bool) -> np.ndarray:
    """numpy arrays or tensors: one concatenate when every dtype is an integer one, else example by example.

    The dtypes are looked at per example (a concatenation would hide a bool or float
    example by promoting it).
    """
    try:
        dtypes = set(map(operator.attrgetter("dtype"), sequences))
    except AttributeError:  # a list among the arrays
        dtypes = {np.dtype(object)}
    if all(_is_integer(d, allow_bool) for d in dtypes):
        try:
            if _is_tensor(sequences[0]):
                import torch

                flat = torch.cat(list(sequences)).numpy(force=True)
            else:
                flat = np.concatenate(sequences)
            if flat.ndim == 1:
                return flat.astype(np.int64, copy=False)
        except (RuntimeError, TypeError, ValueError):
            pass
    return np.concatenate([_checked_array(s, i, what, item, allow_bool) for i, s in enumerate(sequences)])


def _is_integer(dtype: Any, allow_bool: bool) -> bool:
    """Whether a numpy or torch dtype holds integers that fit int64 (or, with ``allow_bool``, bools)."""
    if isinstance(dtype, np.dtype):
        kind = dtype.kind
        return kind == "i" or (kind == "u" and dtype.itemsize < 8) or (allow_bool and kind == "b")
    import torch

    if dtype == torch.bool:
        return allow_bool
    return (
        not (dtype.is_floating_point or dtype.is_complex)
        and dtype.itemsize <= 8
        and dtype != getattr(torch, "uint64", None)
    )


def _as_numpy(sequence: Any) -> np.ndarray:
    if not _is_tensor(sequence):
        return np.asarray(sequence)
    try:
        return sequence.numpy(force=True)
    except TypeError:  # bfloat16 and other dtypes numpy lacks: only to name a bad value
        return sequence.detach().cpu().double().numpy()


def _checked_array(sequence: Any, index: int, what: str, item: str, allow_bool: bool) -> np.ndarray:
    """One example's values as int64 (n,), or an error naming the first value that is not an integer."""
    if _is_tensor(sequence) or isinstance(sequence, np.ndarray):
        values = _as_numpy(sequence)
        if values.ndim != 1:
            raise ValueError(f"{item} {index}: {what} must be one-dimensional, got shape {values.shape}.")
        if values.dtype != object:
            if values.size and not _is_integer(sequence.dtype, allow_bool):
                if values.dtype == np.uint64 and values.max() > _INT64.max:
                    position = int(np.argmax(values > _INT64.max))
                    raise _overflow_error(int(values[position]), position, index, what, item)
                if values.dtype != np.uint64:
                    raise _dtype_error(values, str(sequence.dtype), index, what, item, allow_bool)
            return np.ascontiguousarray(values, dtype=np.int64)
    numbers = []
    for position, value in enumerate(sequence):  # only for an example that is not a list of ints
        try:
            if not allow_bool and type(value) is bool:
                raise TypeError
            number = int(value) if allow_bool and isinstance(value, np.bool_) else operator.index(value)
        except TypeError:
            raise _value_error(value, position, index, what, item, allow_bool) from None
        if not _INT64.min <= number <= _INT64.max:
            raise _overflow_error(number, position, index, what, item)
        numbers.append(number)
    return np.array(numbers, dtype=np.int64)


def _noun(what: str, allow_bool: bool) -> str:
    """What the values must be: token ids, or (masks, other per-token keys, lengths) plain integers."""
    return "integers" if allow_bool or what == "seq_lengths" else "integer token ids"


def _value_error(value: Any, position: int, index: int, what: str, item: str, allow_bool: bool) -> TypeError:
    shown = repr(value) if isinstance(value, (str, bytes)) else str(value)
    fix = _BOOL_FIX if isinstance(value, (bool, np.bool_)) else _FIX
    return TypeError(
        f"{item} {index}: {what} must hold {_noun(what, allow_bool)}, got {type(value).__name__} {shown[:50]} "
        f"at position {position}. " + fix
    )


def _dtype_error(values: np.ndarray, dtype: str, index: int, what: str, item: str, allow_bool: bool) -> TypeError:
    position = 0
    if np.issubdtype(values.dtype, np.floating):
        fractional = np.flatnonzero(values != np.round(values))
        position = int(fractional[0]) if len(fractional) else 0
    return TypeError(
        f"{item} {index}: {what} must hold {_noun(what, allow_bool)}, got dtype {dtype.removeprefix('torch.')} "
        f"({values[position].item()!r} at position {position}). " + (_BOOL_FIX if values.dtype == bool else _FIX)
    )


def _overflow_error(number: int, position: int, index: int, what: str, item: str) -> ValueError:
    return ValueError(
        f"{item} {index}: {what}[{position}] = {number} does not fit in int64; token ids are at most {_INT64.max}."
    )


def check_non_negative(flat: np.ndarray, lengths: np.ndarray, *, item: str = "Example") -> None:
    """Refuse a negative token id in concatenated ``input_ids``, naming the example, position and value.

    Cost: one vectorised ``min`` over the int64 tokens (and, only once one is negative, a search for it).

    >>> check_non_negative(np.array([5, 6, 7, -100]), np.array([2, 2]))
    Traceback (most recent call last):
    ...
    ValueError: Example 1: input_ids[1] = -100 is negative; token ids are 0 or more (an embedding row). A -100 belongs in labels, not input_ids: tokenize again or fix this example.
    """
    if not flat.size or flat.min() >= 0:
        return
    token = int(np.argmax(flat < 0))
    ends = np.cumsum(lengths)
    example = int(np.searchsorted(ends, token, side="right"))
    position = token - int(ends[example] - lengths[example])
    raise ValueError(
        f"{item} {example}: input_ids[{position}] = {int(flat[token])} is negative; token ids are 0 or more (an "
        "embedding row). A -100 belongs in labels, not input_ids: tokenize again or fix this example."
    )


@dataclass(frozen=True)
class TokenFeatures:
    """A batch's per-token features laid end to end: ``input_ids``, ``labels`` and the ``carried`` keys, int64 (T,) each."""

    input_ids: np.ndarray
    labels: np.ndarray
    carried: dict[str, np.ndarray]


def token_features(columns: Columns, *, collator: str) -> TokenFeatures:
    """The columns' values laid end to end, each checked; an example without labels gets labels = input_ids only
    when no example has labels.

    >>> from packing_collators.collate._features import read_columns
    >>> columns = read_columns([{"input_ids": [5, 6], "token_type_ids": [0, 1]}, {"input_ids": [7], "token_type_ids": [1]}],
    ...                        collator="FlatteningCollator")
    >>> tokens = token_features(columns, collator="FlatteningCollator")
    >>> tokens.input_ids.tolist(), tokens.labels.tolist(), {k: v.tolist() for k, v in tokens.carried.items()}
    ([5, 6, 7], [5, 6, 7], {'token_type_ids': [0, 1, 1]})
    """
    item, lengths = columns.item, columns.lengths
    total = int(lengths.sum())
    input_ids = concat_tokens(columns.input_ids, total, item=item)
    check_non_negative(input_ids, lengths, item=item)
    owners = None if columns.masks is None else mask_zero_owners(columns.masks, lengths, item=item)
    labels = input_ids.copy() if columns.labels is None else concat_tokens(columns.labels, total, what="labels", item=item)
    carried = {key: _read_carried(values, total, key, collator, item) for key, values in columns.carried.items()}
    if owners is not None:
        check_unpadded(owners, len(lengths), item=item)
    return TokenFeatures(input_ids, labels, carried)


def _read_carried(values: list, total: int, key: str, collator: str, item: str) -> np.ndarray:
    """A per-token key laid end to end as int64 (total,); integers or bools only, like the tokens."""
    try:
        return concat_tokens(values, total, what=key, item=item, allow_bool=True)
    except TypeError as error:
        raise TypeError(
            f"{error} {collator} carries per-token keys as int64; if {key!r} holds other values (weights, text), "
            f"remove it before collating (dataset.remove_columns([{key!r}]))."
        ) from None


def mask_zero_owners(masks: list, lengths: np.ndarray, *, item: str = "Example") -> np.ndarray:
    """int64, one entry per ``attention_mask`` zero: the example holding it (ascending), for :func:`check_unpadded`.

    ``masks`` holds each example's mask, None for one without (no padding); their lengths are checked.

    >>> mask_zero_owners([None, [1, 0, 0]], np.array([2, 3])).tolist()
    [1, 1]
    >>> check_unpadded(mask_zero_owners([[1, 0]], np.array([2])), 1)
    Traceback (most recent call last):
    ...
    ValueError: Example 0 is padded: its attention_mask has 1 zero(s) (1 of 1 examples have attention_mask zeros). Example 0 has attention_mask zeros inside it, so packing would put its pad tokens into rows and train on them. Tokenize with padding=False, or strip the padding first (keep the tokens where attention_mask is 1).
    """
    masks = [np.ones(n, np.int64) if mask is None else mask for mask, n in zip(masks, lengths.tolist())]
    flat = concat_tokens(masks, int(lengths.sum()), what="attention_mask", item=item, allow_bool=True)
    return np.searchsorted(np.cumsum(lengths), np.flatnonzero(flat == 0), side="right").astype(np.int64)
