"""Turning many token sequences (lists, numpy arrays or tensors) into one flat int64 array.

The fast paths matter: a 64-example batch of Python lists is read with one
``np.fromiter`` over a chained iterator (no intermediate list), and numpy or
torch inputs with a single ``concatenate``.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any, Sequence

import numpy as np

__all__ = ["concat_tokens", "sequence_lengths"]


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def sequence_lengths(sequences: Sequence[Any], *, what: str = "input_ids") -> np.ndarray:
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
            raise ValueError(f"Example {i}: {what} must be one-dimensional, got shape {tuple(shape)}.")
        if not hasattr(seq, "__len__"):
            raise TypeError(f"Example {i}: {what} must be a list, numpy array or tensor of token ids, got {type(seq).__name__}.")
    raise TypeError(f"{what} must be a sequence of token sequences.")


def concat_tokens(sequences: Sequence[Any], total: int, *, what: str = "input_ids") -> np.ndarray:
    """The sequences laid end to end as int64 (total,).

    >>> concat_tokens([[1, 2], np.array([3]), [4, 5, 6]], 6).tolist()
    [1, 2, 3, 4, 5, 6]
    """
    first = sequences[0] if len(sequences) else None
    if _is_tensor(first):
        import torch

        try:
            flat = torch.cat(list(sequences)).numpy(force=True)
        except (RuntimeError, TypeError):
            flat = None
        if flat is None or flat.ndim != 1:
            flat = np.concatenate([_one_dimensional(s, i, what) for i, s in enumerate(sequences)])
    elif isinstance(first, np.ndarray):
        try:
            flat = np.concatenate(sequences)
        except ValueError:
            flat = np.concatenate([_one_dimensional(s, i, what) for i, s in enumerate(sequences)])
        if flat.ndim != 1:
            flat = np.concatenate([_one_dimensional(s, i, what) for i, s in enumerate(sequences)])
    else:
        _check_first_tokens_are_ints(sequences, what)
        return np.fromiter(chain.from_iterable(sequences), dtype=np.int64, count=total)
    if flat.size and not np.issubdtype(flat.dtype, np.integer):
        raise TypeError(f"{what} must hold integer token ids, got dtype {flat.dtype}.")
    return flat.astype(np.int64, copy=False)


def _one_dimensional(sequence: Any, index: int, what: str) -> np.ndarray:
    array = np.asarray(sequence.numpy(force=True) if _is_tensor(sequence) else sequence)
    if array.ndim != 1:
        raise ValueError(f"Example {index}: {what} must be one-dimensional, got shape {array.shape}.")
    return array


def _check_first_tokens_are_ints(sequences: Sequence[Any], what: str) -> None:
    """Refuse lists of non-integers (np.fromiter would silently floor 1.5 to 1).

    Only each sequence's first token is looked at, which keeps the list path fast
    and catches what real mistakes look like (text, floats, nested lists).
    """
    try:
        if set(map(type, map(itemgetter(0), sequences))) <= {int}:
            return
    except (IndexError, KeyError, TypeError):
        pass  # an empty sequence: look one by one
    for i, seq in enumerate(sequences):
        if len(seq) and (isinstance(seq[0], bool) or not isinstance(seq[0], (int, np.integer))):
            raise TypeError(f"Example {i}: {what} must hold integer token ids, got {type(seq[0]).__name__} {seq[0]!r}.")
