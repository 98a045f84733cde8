"""Length buckets: flat rows padded to one of a few total lengths, so ``torch.compile`` sees few shapes.

A compiled model specialises its graph on the row's length ``T``; a packed batch has a new ``T``
almost every step. Padded up to the smallest bucket that holds it, a row takes one of ``count``
lengths, and the padding is a segment of its own (labels ``label_pad_id``, positions restarting,
its own ``cu_seq_lens`` entry), so no example attends to it and it is never a target::

    buckets (16, 24, 32), tokens [a b c d e | f g h i j k l m n o p q r] (18)  ->  T = 24
    input_ids    = [[a ... r, 0, 0, 0, 0, 0, 0]]            int64 (1, 24)
    labels       = [[..., -100, -100, -100, -100, -100, -100]]
    cu_seq_lens  = [0, 5, 18, 24]                            the padding: one more segment

``length_buckets(max_tokens)`` picks geometric buckets (each ``ratio`` times the one below, the
top one ``max_tokens``): a row that just misses a bucket pads at most ``1 - 1 / ratio`` of its
slots (20% at the default 1.25); multipack micro-batches, filled to their budget, mostly land in
the top bucket with well under 1% padding. Cost: one ``searchsorted`` per batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["bucket_length", "bucket_padding_fraction", "length_buckets", "validate_buckets"]


def length_buckets(max_tokens: int, *, count: int = 4, ratio: float = 1.25, multiple: int = 64) -> tuple[int, ...]:
    """``count`` row lengths up to ``max_tokens``, each about ``ratio`` times the one below, multiples of ``multiple``.

    The top bucket is ``max_tokens`` itself (rounded up to ``multiple``); buckets that round to
    the same length are merged, so at most ``count`` come back.

    >>> length_buckets(16384)
    (8448, 10496, 13120, 16384)
    >>> length_buckets(100, count=3, multiple=8)
    (72, 88, 104)
    >>> length_buckets(16384, count=0)
    Traceback (most recent call last):
    ...
    ValueError: count must be a positive integer, got 0.
    """
    from .._validation import validate_positive_int

    validate_positive_int("max_tokens", max_tokens)
    validate_positive_int("count", count)
    validate_positive_int("multiple", multiple)
    if not (isinstance(ratio, (int, float)) and ratio > 1 and math.isfinite(ratio)):
        raise ValueError(f"ratio must be a number > 1 (each bucket that many times the one below), got {ratio!r}.")
    top = -(-max_tokens // multiple) * multiple
    lengths = {-(-int(top / ratio**i) // multiple) * multiple for i in range(count)}
    return tuple(sorted(n for n in lengths if n > 0))


def validate_buckets(buckets, *, multiple_of: int | None = None) -> tuple[int, ...] | None:
    """``buckets`` as a sorted tuple of distinct positive ints (None stays None), or a ValueError saying why.

    >>> validate_buckets([32, 16, 24])
    (16, 24, 32)
    >>> validate_buckets([16, 20], multiple_of=8)
    Traceback (most recent call last):
    ...
    ValueError: pad_to_buckets=[16, 20]: bucket 20 is not a multiple of pad_to_multiple_of=8; pick buckets that are (length_buckets(max_tokens, multiple=8)).
    """
    if buckets is None:
        return None
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not len(buckets):
        raise ValueError(
            f"pad_to_buckets must be a non-empty list of row lengths (e.g. length_buckets(16384)), got {buckets!r}."
        )
    for value in buckets:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"pad_to_buckets={list(buckets)!r}: {value!r} is not a positive integer row length.")
        if multiple_of and value % multiple_of:
            raise ValueError(
                f"pad_to_buckets={list(buckets)!r}: bucket {value} is not a multiple of pad_to_multiple_of="
                f"{multiple_of}; pick buckets that are (length_buckets(max_tokens, multiple={multiple_of}))."
            )
    return tuple(sorted({int(v) for v in buckets}))


def bucket_length(total: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``total`` tokens (sorted ``buckets``), or a ValueError with the fix.

    >>> bucket_length(18, (16, 24, 32))
    24
    >>> bucket_length(40, (16, 24, 32))
    Traceback (most recent call last):
    ...
    ValueError: A batch of 40 tokens is longer than the largest bucket (32) of pad_to_buckets=(16, 24, 32). Add a bucket of at least 40 tokens, or cap the batches (PackingTrainer's max_tokens_per_batch, MultipackBatchSampler's budget) at 32.
    """
    index = int(np.searchsorted(buckets, total))
    if index == len(buckets):
        raise ValueError(
            f"A batch of {total} tokens is longer than the largest bucket ({buckets[-1]}) of pad_to_buckets="
            f"{tuple(buckets)}. Add a bucket of at least {total} tokens, or cap the batches (PackingTrainer's "
            f"max_tokens_per_batch, MultipackBatchSampler's budget) at {buckets[-1]}."
        )
    return int(buckets[index])


def bucket_padding_fraction(totals, buckets: Sequence[int]) -> float:
    """Pad slots / all slots when rows of ``totals`` tokens are padded to ``buckets``: what the buckets cost.

    >>> bucket_padding_fraction([18, 32, 16], (16, 24, 32))
    0.0833
    """
    totals = np.asarray(totals, dtype=np.int64)
    slots = sum(bucket_length(int(t), buckets) for t in totals)
    return round(1 - float(totals.sum()) / slots, 4) if slots else 0.0
