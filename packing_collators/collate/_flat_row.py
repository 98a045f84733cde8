"""One flat row from concatenated tokens and the layout of their segments: what both collators return.

Tokens ``[5, 6, 7, 8, 9]`` in segments ``[2, 3]``, laid out padded to 8 tokens (``layout.padded_to(8)``)::

    input_ids     = [[   5, 6,    7, 8, 9,    0,    0,    0]]     int64 (1, T)
    labels        = [[-100, 6, -100, 8, 9, -100, -100, -100]]     int64 (1, T)
    position_ids  = [[   0, 1,    0, 1, 2,    0,    1,    2]]     int64 (1, T)
    cu_seq_lens_q = cu_seq_lens_k = [0, 2, 5, 8]                  int32 (n + 1,)
    max_length_q  = max_length_k  = 3

The padding is a segment of its own, so nothing attends to it and it is never a target. The keys
are written through the batch's home (:mod:`packing_collators.batch`). Cost: a few vectorised numpy
ops (a ``repeat`` and a ``cumsum``), no loop over tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..batch import SEQ_IDX, SegmentLayout, segment_layout, varlen_kwargs  # noqa: F401  (segment_layout: the doctests)
from ._concat import TokenFeatures

__all__ = ["flat_batch"]


def _padded(values: np.ndarray, total: int, fill: int) -> np.ndarray:
    """int64 (1, total): ``values`` then ``fill`` up to ``total``."""
    pad = total - len(values)
    return (np.r_[values, np.full(pad, fill, np.int64)] if pad else values)[None]


def flat_batch(
    tokens: TokenFeatures,
    layout: SegmentLayout,
    *,
    pad_token_id: int = 0,
    position_ids_start: int = 0,
    label_pad_id: int = -100,
    return_seq_idx: bool = False,
) -> dict[str, Any]:
    """The flattened batch (numpy) of ``tokens`` laid out as ``layout``'s segments, padded to ``layout.total``.

    ``tokens.labels`` is changed in place: the first label of every segment becomes ``label_pad_id``.
    Carried per-token keys come back as int64 (1, T), 0 in the padding.

    >>> tokens = TokenFeatures(np.array([5, 6, 7, 8, 9]), np.array([5, 6, 7, 8, 9]), {})
    >>> batch = flat_batch(tokens, segment_layout([2, 3]).padded_to(6))
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 6, -100, 8, 9, -100]], [[0, 1, 0, 1, 2, 0]], [0, 2, 5, 6])
    """
    labels = _padded(tokens.labels, layout.total, label_pad_id)
    labels[0, layout.starts] = label_pad_id
    batch = {
        "input_ids": _padded(tokens.input_ids, layout.total, pad_token_id),
        "labels": labels,
        "position_ids": layout.position_ids(position_ids_start)[None],
        **varlen_kwargs(layout),
    }
    if return_seq_idx:
        batch[SEQ_IDX] = layout.seq_idx()[None]
    for key, values in tokens.carried.items():
        batch[key] = _padded(values, layout.total, 0)
    return batch
