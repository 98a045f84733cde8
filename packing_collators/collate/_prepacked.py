"""Batches of pre-packed rows (from :func:`pack_dataset`): flattened, or padded to a fixed shape.

Two rows, ``seq_lengths`` ``[3, 2]`` and ``[4]``, ``max_length=6``::

    mode="flatten" (one row, like FlatteningCollator)       mode="pad" (static shape (B, max_length))
    input_ids    [[a, b, c, d, e, f, g, h, i]]              [[a, b, c, d, e, 0], [f, g, h, i, 0, 0]]
    labels       [[-, b, c, -, e, -, g, h, i]]              [[-, b, c, -, e, -], [-, g, h, i, -, -]]
    position_ids [[0, 1, 2, 0, 1, 0, 1, 2, 3]]              [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    cu_seq_lens  [0, 3, 5, 9]                               (not returned)

(``-`` is -100.) Padding is a segment of its own: its positions restart at 0
and its labels are -100, so with ``position_ids`` (and no ``attention_mask``)
transformers' masks keep every example to itself. Positions are rebuilt from
``seq_lengths``, not read from the rows. Cost: a concatenation and a few
vectorised numpy ops per batch, no Python loop over tokens.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import numpy as np

from .._validation import validate_choice, validate_positive_int
from ..engine import check_not_too_long
from ._features import check_same_lengths, check_unpadded, feature_column, to_tensors
from ._options import CollateOptions, ReturnTensors
from ._segments import segment_layout
from ._concat import concat_tokens, sequence_lengths

__all__ = ["PrePackedCollator"]

Mode = Literal["flatten", "pad"]


class PrePackedCollator:
    """Collate rows of a packed dataset (``data_collator=`` for a Trainer).

    Args:
        mode: ``"flatten"`` (default): the rows laid end to end in one ``(1, T)`` row with
            ``cu_seq_lens_*`` built from their ``seq_lengths`` (for flash-attention varlen);
            ``"pad"``: ``(B, max_length)`` rows right-padded with ``pad_token_id`` (static shapes).
        max_length: row width for ``mode="pad"`` (required there); a longer row is an error.
        pad_to_multiple_of: ``mode="flatten"`` only: pad ``T`` to a multiple of this.
        pad_token_id: token id of the padding.
        return_tensors: ``"pt"`` or ``"np"``.
        position_ids_start: first position of every segment.
        return_seq_idx: also return ``seq_idx`` (segment index of each token; per row in ``"pad"``).
        label_pad_id: label of each segment's first token and of padding.

    Rows need ``input_ids`` and ``seq_lengths`` (summing to the row's length) and may have
    ``labels``; an ``attention_mask`` must be all ones; other keys are ignored. Train with
    ``remove_unused_columns=False`` so the Trainer keeps ``seq_lengths``.

    Returns (``T`` tokens, ``n`` segments, ``B`` rows):
        ``"flatten"``: ``input_ids``, ``labels``, ``position_ids`` int64 (1, T); ``cu_seq_lens_q`` /
        ``cu_seq_lens_k`` int32 (n + 1,); ``max_length_q`` / ``max_length_k`` int; ``seq_idx``
        int32 (1, T) if asked for. The same keys and dtypes as :class:`FlatteningCollator`.
        ``"pad"``: ``input_ids``, ``labels``, ``position_ids`` int64 (B, max_length); ``seq_idx``
        int32 (B, max_length) if asked for. No ``cu_seq_lens`` (they would describe the
        flattened ``B * max_length`` tokens, which no attention path expects) and no ``attention_mask``.

    >>> rows = [{"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [3, 2]}, {"input_ids": [6, 7], "seq_lengths": [2]}]
    >>> batch = PrePackedCollator(return_tensors="np")(rows)
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 2, 3, -100, 5, -100, 7]], [[0, 1, 2, 0, 1, 0, 1]], [0, 3, 5, 7])
    >>> batch = PrePackedCollator(mode="pad", max_length=6, return_tensors="np")(rows)
    >>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
    ([[1, 2, 3, 4, 5, 0], [6, 7, 0, 0, 0, 0]], [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]])
    >>> batch["labels"].tolist()
    [[-100, 2, 3, -100, 5, -100], [-100, 7, -100, -100, -100, -100]]
    """

    def __init__(
        self,
        *,
        mode: Mode = "flatten",
        max_length: int | None = None,
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        return_tensors: ReturnTensors = "pt",
        position_ids_start: int = 0,
        return_seq_idx: bool = False,
        label_pad_id: int = -100,
    ) -> None:
        validate_choice("mode", mode, Mode)
        self.options = CollateOptions.pick(locals())
        validate_positive_int("max_length", max_length, allow_none=True)
        if mode == "pad" and max_length is None:
            raise ValueError("mode='pad' needs max_length (the packed rows' width, e.g. pack_dataset's max_length).")
        if mode == "pad" and pad_to_multiple_of is not None:
            raise ValueError("pad_to_multiple_of is for mode='flatten'; with mode='pad' every row is max_length wide.")
        self.mode = mode
        self.max_length = max_length

    def __repr__(self) -> str:
        return f"PrePackedCollator(mode={self.mode!r}, max_length={self.max_length}, {self.options.keywords()})"

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not len(rows):
            raise ValueError("PrePackedCollator got an empty batch (no rows).")
        input_ids, labels, row_lengths, segments, segments_per_row = self._read(rows)
        if self.mode == "flatten":
            batch = self.options.flat_batch(input_ids, labels, segments)
        else:
            batch = self._pad(input_ids, labels, row_lengths, segments, segments_per_row)
        return to_tensors(batch, self.options.return_tensors)

    def _read(self, rows):
        ids = feature_column(rows, "input_ids")
        row_lengths = sequence_lengths(ids)
        total = int(row_lengths.sum())
        seq_column = feature_column(rows, "seq_lengths")
        segments_per_row = sequence_lengths(seq_column, what="seq_lengths")
        segments = concat_tokens(seq_column, int(segments_per_row.sum()), what="seq_lengths")
        _check_segments(segments, segments_per_row, row_lengths)
        input_ids = concat_tokens(ids, total)
        if "labels" in rows[0]:
            label_column = feature_column(rows, "labels")
            check_same_lengths(sequence_lengths(label_column, what="labels"), row_lengths, "labels", item="Row")
            labels = concat_tokens(label_column, total, what="labels")
        else:
            labels = input_ids.copy()
        if "attention_mask" in rows[0]:
            check_unpadded(rows, row_lengths)
        return input_ids, labels, row_lengths, segments, segments_per_row

    def _pad(self, input_ids, labels, row_lengths, segments, segments_per_row):
        width, num_rows = self.max_length, len(row_lengths)
        check_not_too_long(
            row_lengths,
            width,
            limit_name="max_length",
            fix="Pass the max_length the dataset was packed with (or a larger one).",
            item="Row",
            count=False,
        )
        pads = width - row_lengths
        # every row's segments, then its padding as one more segment (when it has any)
        ends = np.cumsum(segments_per_row)
        with_pad = np.insert(segments, ends, pads)
        with_pad = with_pad[with_pad > 0]
        layout = segment_layout(with_pad)
        row_of_token = np.repeat(np.arange(num_rows), row_lengths)
        starts_in_flat = np.r_[0, np.cumsum(row_lengths)[:-1]]
        target = row_of_token * width + np.arange(len(input_ids)) - np.repeat(starts_in_flat, row_lengths)
        padded_ids = np.full(num_rows * width, self.options.pad_token_id, np.int64)
        padded_ids[target] = input_ids
        padded_labels = np.full(num_rows * width, self.options.label_pad_id, np.int64)
        padded_labels[target] = labels
        padded_labels[layout.starts] = self.options.label_pad_id
        batch = {
            "input_ids": padded_ids.reshape(num_rows, width),
            "labels": padded_labels.reshape(num_rows, width),
            "position_ids": layout.position_ids(self.options.position_ids_start).reshape(num_rows, width),
        }
        if self.options.return_seq_idx:
            seq_idx = layout.seq_idx().reshape(num_rows, width)
            batch["seq_idx"] = seq_idx - seq_idx[:, :1]
        return batch


def _check_segments(segments: np.ndarray, segments_per_row: np.ndarray, row_lengths: np.ndarray) -> None:
    """Every row's ``seq_lengths`` must be positive and sum to its number of tokens."""
    empty = np.flatnonzero(row_lengths == 0)
    if len(empty):
        raise ValueError(f"Row {int(empty[0])} has no tokens; a packed row holds at least one example.")
    row_of_segment = np.repeat(np.arange(len(row_lengths)), segments_per_row)
    sums = np.bincount(row_of_segment, weights=segments, minlength=len(row_lengths)).astype(np.int64)
    bad = np.flatnonzero((sums != row_lengths) | (segments_per_row == 0))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"Row {i}: seq_lengths sum to {sums[i]} but input_ids has {row_lengths[i]} tokens; the row is not a "
            "valid packed row. Pack with pack_dataset (or fix its seq_lengths)."
        )
    nonpositive = np.flatnonzero(segments <= 0)
    if len(nonpositive):
        i = int(row_of_segment[nonpositive[0]])
        raise ValueError(f"Row {i}: seq_lengths has a length of {segments[nonpositive[0]]}; every segment needs at least one token.")
