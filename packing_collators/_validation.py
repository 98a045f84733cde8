"""The checks every part of the package runs on what a user passes: one home, one wording.

Each check raises a ``ValueError`` (or ``TypeError`` for a wrong type) that names the
argument or example, the value given, what is allowed, and returns the value normalised::

    validate_positive_int("capacity", 0)           ValueError: capacity must be a positive integer, got 0.
    validate_positive_int("seed", -1, minimum=0)   ValueError: seed must be an integer >= 0, got -1.
    validate_choice("strategy", "x", Strategy)     ValueError: strategy='x' is not supported; choose one of ...
    validate_lengths([3, -1])                      ValueError: Example 1 has a negative length (-1); ...
    validate_attention_weight(-1)                  ValueError: attention_weight must be a finite number >= 0, ...
    check_not_too_long([3, 12], 8, ...)             ValueError: Example 1 has 12 tokens, more than capacity=8 ...
    check_unpadded(zero_owners=[1], 3)             ValueError: Example 1 is padded: its attention_mask has 1 zero(s) ...

``check_not_too_long`` serves every packer (engine, sampler, offline, chat, collators) and
``check_unpadded`` both the collators (a batch's features) and ``pack_dataset`` (an Arrow
table): each caller finds the examples, these say what is wrong in the one wording.

Cost: constant per argument, one vectorised pass over ``lengths``. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import get_args

import numpy as np

__all__ = [
    "check_not_too_long",
    "check_unpadded",
    "validate_attention_weight",
    "validate_choice",
    "validate_flag",
    "validate_lengths",
    "validate_positive_int",
]

PADDING_FIX = "Tokenize with padding=False, or strip the padding first (keep the tokens where attention_mask is 1)."


def validate_lengths(lengths: Sequence[int] | np.ndarray, *, what: str = "lengths") -> np.ndarray:
    """``lengths`` as int64, or a clear error naming the first bad example.

    >>> validate_lengths([3, 2.0]).tolist()
    [3, 2]
    >>> validate_lengths([3, -1])
    Traceback (most recent call last):
    ...
    ValueError: Example 1 has a negative length (-1); lengths are token counts, >= 0.
    """
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional (one length per example), got shape {array.shape}.")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.mod(array, 1) == 0):
            array = array.astype(np.int64)
        else:
            raise TypeError(f"{what} must be integers (token counts), got dtype {array.dtype}.")
    array = array.astype(np.int64, copy=False)
    negative = np.flatnonzero(array < 0)
    if len(negative):
        i = int(negative[0])
        raise ValueError(f"Example {i} has a negative length ({array[i]}); lengths are token counts, >= 0.")
    return array


def validate_choice(name: str, value: str, allowed) -> None:
    """Raise a ValueError naming the allowed values when ``value`` is not one of them.

    ``allowed``: a ``Literal`` type, or a tuple of its values that one caller accepts.

    >>> from typing import Literal
    >>> validate_choice("mode", "fold", Literal["flatten", "pad"])
    Traceback (most recent call last):
    ...
    ValueError: mode='fold' is not supported; choose one of 'flatten', 'pad'.
    >>> validate_choice("overflow", "split", ("error", "drop"))
    Traceback (most recent call last):
    ...
    ValueError: overflow='split' is not supported; choose one of 'error', 'drop'.
    """
    allowed = allowed if isinstance(allowed, tuple) else get_args(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, allowed))}.")


def validate_flag(name: str, value) -> bool:
    """``value`` if it is a bool (numpy's too); anything else is refused, not read as true or false.

    >>> validate_flag("share_prompt", True)
    True
    >>> validate_flag("share_prompt", "no")
    Traceback (most recent call last):
    ...
    ValueError: share_prompt must be True or False, got 'no'.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def validate_positive_int(name: str, value, *, minimum: int = 1, allow_none: bool = False, none_means: str = ""):
    """``value`` as an ``int`` if it is an integer >= ``minimum`` (or None, when allowed); bools are refused.

    ``none_means`` says what None stands for, in the error (``"derived from the batch size"``).

    >>> validate_positive_int("pad_to_multiple_of", None, allow_none=True)
    >>> validate_positive_int("capacity", 0)
    Traceback (most recent call last):
    ...
    ValueError: capacity must be a positive integer, got 0.
    >>> validate_positive_int("seed", -1, minimum=0)
    Traceback (most recent call last):
    ...
    ValueError: seed must be an integer >= 0, got -1.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if allow_none:
            wanted += f" or None ({none_means})" if none_means else " or None"
        raise ValueError(f"{name} must be {wanted}, got {value!r}.")
    return int(value)


def validate_attention_weight(attention_weight) -> float | None:
    """``attention_weight`` as a float (``None`` stays ``None``), or the error saying what to pass.

    >>> validate_attention_weight(None), validate_attention_weight(2e-5)
    (None, 2e-05)
    >>> validate_attention_weight(-1)
    Traceback (most recent call last):
    ...
    ValueError: attention_weight must be a finite number >= 0, got -1. Pass None for the default (1 / max_tokens_per_batch), 0 to balance by tokens alone, or CostFit.attention_weight from fit_attention_weight(); for attention alone use balance='attention'.
    """
    if attention_weight is None:
        return None
    if isinstance(attention_weight, bool) or not isinstance(attention_weight, Real):
        raise TypeError(
            f"attention_weight must be a number or None, got {type(attention_weight).__name__} {attention_weight!r}."
        )
    try:
        value = float(attention_weight)
    except OverflowError:  # an int too large for a float
        value = math.inf
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"attention_weight must be a finite number >= 0, got {attention_weight!r}. Pass None for the default "
            "(1 / max_tokens_per_batch), 0 to balance by tokens alone, or CostFit.attention_weight from "
            "fit_attention_weight(); for attention alone use balance='attention'."
        )
    return value


def check_not_too_long(
    lengths: np.ndarray,
    limit: int,
    *,
    limit_name: str,
    fix: str,
    item: str = "Example",
    first_index: int = 0,
    count: bool = True,
) -> None:
    """Raise a ValueError naming the first of ``lengths`` over ``limit``: its index, its length, the limit and ``fix``.

    ``first_index`` numbers the items from where they start (a buffer in a stream);
    ``count`` adds how many are too long and the longest (leave it off when ``lengths``
    is only part of the input, where those numbers would mislead).

    >>> check_not_too_long(np.array([3, 12, 9]), 8, limit_name="capacity", fix="Raise the capacity.")
    Traceback (most recent call last):
    ...
    ValueError: Example 1 has 12 tokens, more than capacity=8 (2 example(s) too long, the longest 12 tokens). Raise the capacity.
    """
    lengths = np.asarray(lengths)
    too_long = np.flatnonzero(lengths > limit)
    if not len(too_long):
        return
    i = int(too_long[0])
    counts = (
        f" ({len(too_long)} example(s) too long, the longest {int(lengths[too_long].max())} tokens)" if count else ""
    )
    raise ValueError(f"{item} {first_index + i} has {lengths[i]} tokens, more than {limit_name}={limit}{counts}. {fix}")


def check_unpadded(
    zero_owners: Sequence[int] | np.ndarray,
    num_examples: int,
    *,
    first_index: int = 0,
    stream: bool = False,
    item: str = "Example",
) -> None:
    """Refuse padded examples: an ``attention_mask`` with zeros, whose pad tokens would be packed and trained on.

    ``zero_owners`` lists, for each zero of the attention masks, the example holding it (ascending,
    counted from 0 among the ``num_examples`` checked). Errors number the examples from
    ``first_index`` (where they start in a stream); with ``stream``, the count is of the examples
    read so far (the earlier ones passed this check).

    >>> check_unpadded([1, 2, 2], 3)
    Traceback (most recent call last):
    ...
    ValueError: Example 1 is padded: its attention_mask has 1 zero(s) (2 of 3 examples have attention_mask zeros). Example 1 has attention_mask zeros inside it, so packing would put its pad tokens into rows and train on them. Tokenize with padding=False, or strip the padding first (keep the tokens where attention_mask is 1).
    """
    owners = np.asarray(zero_owners, dtype=np.int64)
    if not len(owners):
        return
    first = int(owners[0])
    zeros = int(np.searchsorted(owners, first, side="right"))
    padded = int(np.count_nonzero(np.diff(owners))) + 1
    among = f"the first {first_index + num_examples:,}" if stream else f"{num_examples:,}"
    items = f"{item.lower()}s"
    name = f"{item} {first_index + first}"
    raise ValueError(
        f"{name} is padded: its attention_mask has {zeros} zero(s) ({padded:,} of {among} {items} have attention_mask "
        f"zeros). {name} has attention_mask zeros inside it, so packing would put its pad tokens into rows and train "
        f"on them. {PADDING_FIX}"
    )
