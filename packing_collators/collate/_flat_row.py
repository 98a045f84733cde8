"""One flat row from concatenated tokens and their segment lengths: what both collators return.

Segments ``[2, 3]`` of tokens ``[5, 6, 7, 8, 9]``, padded to a multiple of 8::

    input_ids    = [[   5, 6,    7, 8, 9,    0,    0,    0]]     int64 (1, T)
    labels       = [[-100, 6, -100, 8, 9, -100, -100, -100]]     int64 (1, T)
    position_ids = [[   0, 1,    0, 1, 2,    0,    1,    2]]     int64 (1, T)
    cu_seq_lens  = [0, 2, 5, 8]                                  int32 (n + 1,)

The padding is a segment of its own, so nothing attends to it and it is never a target.
Cost: a few vectorised numpy ops (a ``repeat`` and a ``cumsum``), no loop over tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._segments import SegmentLayout, segment_layout  # noqa: F401  (segment_layout: the doctests use it)

__all__ = ["flat_batch", "pad_to_multiple"]


def pad_to_multiple(input_ids, labels, segments, multiple: int | None, pad_token_id: int, label_pad_id: int):
    """``(input_ids, labels, segments)`` with a padding segment appended so the length is a multiple of ``multiple``.

    The padding is ``pad_token_id`` in the tokens and ``label_pad_id`` in the labels; unchanged
    when ``multiple`` is None or the length is already a multiple of it.

    >>> ids, labels, segments = pad_to_multiple(np.array([1, 2, 3]), np.array([1, 2, 3]), np.array([3]), 4, 0, -100)
    >>> ids.tolist(), labels.tolist(), segments.tolist()
    ([1, 2, 3, 0], [1, 2, 3, -100], [3, 1])
    """
    pad = -len(input_ids) % multiple if multiple else 0
    if not pad:
        return input_ids, labels, segments
    return (
        np.r_[input_ids, np.full(pad, pad_token_id, np.int64)],
        np.r_[labels, np.full(pad, label_pad_id, np.int64)],
        np.r_[segments, pad],
    )


def flat_batch(
    input_ids: np.ndarray,
    labels: np.ndarray,
    layout: SegmentLayout,
    *,
    position_ids_start: int = 0,
    label_pad_id: int = -100,
    return_seq_idx: bool = False,
) -> dict[str, Any]:
    """The flattened batch (numpy) for tokens already laid out as ``layout``'s segments.

    ``labels`` is changed in place: the first label of every segment becomes ``label_pad_id``.

    >>> layout = segment_layout([2, 3])
    >>> batch = flat_batch(np.array([5, 6, 7, 8, 9]), np.array([5, 6, 7, 8, 9]), layout)
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 6, -100, 8, 9]], [[0, 1, 0, 1, 2]], [0, 2, 5])
    """
    labels[layout.starts] = label_pad_id
    batch = {
        "input_ids": input_ids[None],
        "labels": labels[None],
        "position_ids": layout.position_ids(position_ids_start)[None],
        "cu_seq_lens_q": layout.cu_seq_lens,
        "cu_seq_lens_k": layout.cu_seq_lens,
        "max_length_q": layout.max_length,
        "max_length_k": layout.max_length,
    }
    if return_seq_idx:
        batch["seq_idx"] = layout.seq_idx()[None]
    return batch
