"""Batches of pre-packed rows (from :func:`pack_dataset`): flattened, or padded to a fixed shape.

Two rows, ``seq_lengths`` ``[3, 2]`` and ``[4]``, ``max_length=6``::

    mode="flatten" (one row, like FlatteningCollator)       mode="pad" (static shape (B, max_length))
    input_ids    [[a, b, c, d, e, f, g, h, i]]              [[a, b, c, d, e, 0], [f, g, h, i, 0, 0]]
    labels       [[-, b, c, -, e, -, g, h, i]]              [[-, b, c, -, e, -], [-, g, h, i, -, -]]
    position_ids [[0, 1, 2, 0, 1, 0, 1, 2, 3]]              [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    cu_seq_lens  [0, 3, 5, 9]                               (not returned)
    token_type_ids (any other per-token key): laid out like input_ids, 0 in the padding

(``-`` is -100.) Padding is a segment of its own: its positions restart at 0
and its labels are -100, so with ``position_ids`` (and no ``attention_mask``)
transformers' masks keep every example to itself. Positions are rebuilt from
``seq_lengths``, not read from the rows. Cost: a concatenation and a few
vectorised numpy ops per batch, no Python loop over tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._ranges import ranges
from .._validation import check_not_too_long
from ..batch import SEQ_IDX, segment_layout
from ._concat import TokenFeatures, concat_tokens, token_features
from ._features import feature_column, read_columns, sequence_lengths
from ._kept_columns import per_example_values
from ._media import MEDIA_KEYS
from ._no_targets import NoTargetWarning
from ._options import Mode, PrePackedOptions, ReturnTensors
from ._padded_rows import into_rows

__all__ = ["PrePackedCollator"]


class PrePackedCollator:
    """Collate rows of a packed dataset (``data_collator=`` for a Trainer).

    Args:
        mode: ``"flatten"`` (default): the rows laid end to end in one ``(1, T)`` row with
            ``cu_seq_lens_*`` built from their ``seq_lengths`` (for flash-attention varlen);
            ``"pad"``: ``(B, max_length)`` rows right-padded with ``pad_token_id`` (static shapes).
        max_length: row width for ``mode="pad"`` (required there); a longer row is an error.
        pad_to_multiple_of: ``mode="flatten"`` only: pad ``T`` to a multiple of this.
        keep_columns: per-example columns of the rows (``pack_dataset(keep_columns=...)``) to
            return, one value per example, in the order of the batch's segments.
        pad_token_id: token id of the padding.
        return_tensors: ``"pt"`` or ``"np"``.
        position_ids_start: first position of every segment.
        return_seq_idx: also return ``seq_idx`` (segment index of each token; per row in ``"pad"``).
        label_pad_id: label of each segment's first token and of padding.
        disable_cache: put ``use_cache=False`` in every batch (default True), so a model whose
            config keeps transformers' default ``use_cache=True`` builds no KV cache in training (a
            cache switches off the packed-sequence masks of sdpa/eager/flex, and the examples of a
            row would attend to each other). Every transformers causal LM's forward takes it; pass
            False only for a model whose forward does not (then set its config's use_cache off).

    Rows need ``input_ids`` and ``seq_lengths`` (summing to the row's length) and may have
    ``labels`` (every row has them or none does); an ``attention_mask`` must be all ones in
    every row that has one; ``position_ids`` are rebuilt from ``seq_lengths``. Any other
    key with one entry per token (e.g. ``token_type_ids``, which :func:`pack_dataset`
    concatenates like ``input_ids``) is carried. A column :func:`pack_dataset` kept per example
    (its ``keep_columns``, the command line's ``--keep-column``: a list of one value per segment)
    is carried when named in ``keep_columns`` here too; any other key that is not per-token (a
    number, a string) is a ValueError naming the row and the fix, and a key whose value is None
    is skipped. Every value must be an
    integer (a float, string or None is a TypeError). Train with ``Trainer(...,
    remove_unused_columns=False)`` so the Trainer keeps ``seq_lengths`` (then remove the
    columns the model does not take from the dataset), or with :class:`PackingTrainer`,
    whose ``remove_unused_columns=True`` keeps it.

    Returns (``T`` tokens, ``n`` segments, ``B`` rows):
        ``"flatten"``: ``input_ids``, ``labels``, ``position_ids`` int64 (1, T); ``cu_seq_lens_q`` /
        ``cu_seq_lens_k`` int32 (n + 1,); ``max_length_q`` / ``max_length_k`` int; ``seq_idx``
        int32 (1, T) if asked for. The same keys and dtypes as :class:`FlatteningCollator`.
        ``"pad"``: ``input_ids``, ``labels``, ``position_ids`` int64 (B, max_length); ``seq_idx``
        int32 (B, max_length) if asked for. No ``cu_seq_lens`` (they would describe the
        flattened ``B * max_length`` tokens, which no attention path expects) and no ``attention_mask``.
        Both: each carried per-token key (e.g. ``token_type_ids``) int64, the shape of
        ``input_ids``, 0 in the padding; each ``keep_columns`` key (n,): int64 for integers,
        the stored float dtype for floats, else a list of n values (strings).
        And ``use_cache`` False, last (unless ``disable_cache=False``).

    >>> rows = [{"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [3, 2]}, {"input_ids": [6, 7], "seq_lengths": [2]}]
    >>> batch = PrePackedCollator(return_tensors="np")(rows)
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 2, 3, -100, 5, -100, 7]], [[0, 1, 2, 0, 1, 0, 1]], [0, 3, 5, 7])
    >>> batch = PrePackedCollator(mode="pad", max_length=6, return_tensors="np")(rows)
    >>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
    ([[1, 2, 3, 4, 5, 0], [6, 7, 0, 0, 0, 0]], [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]])
    >>> batch["labels"].tolist()
    [[-100, 2, 3, -100, 5, -100], [-100, 7, -100, -100, -100, -100]]
    >>> rows[0]["token_type_ids"], rows[1]["token_type_ids"] = [0, 0, 0, 1, 1], [1, 1]
    >>> PrePackedCollator(mode="pad", max_length=6, return_tensors="np")(rows)["token_type_ids"].tolist()
    [[0, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0]]
    >>> rows[0]["source"], rows[1]["source"] = ["web", "math"], ["code"]  # pack_dataset(keep_columns=["source"])
    >>> PrePackedCollator(keep_columns=["source"])(rows)["source"]
    ['web', 'math', 'code']
    """

    def __init__(
        self,
        *,
        mode: Mode = "flatten",
        max_length: int | None = None,
        pad_token_id: int = 0,
        return_tensors: ReturnTensors = "pt",
        position_ids_start: int = 0,
        return_seq_idx: bool = False,
        pad_to_multiple_of: int | None = None,
        label_pad_id: int = -100,
        disable_cache: bool = True,
        keep_columns: Sequence[str] = (),
    ) -> None:
        self.options = PrePackedOptions(
            mode=mode, max_length=max_length, pad_token_id=pad_token_id, return_tensors=return_tensors,
            pad_to_multiple_of=pad_to_multiple_of, position_ids_start=position_ids_start,
            return_seq_idx=return_seq_idx, label_pad_id=label_pad_id, disable_cache=disable_cache,
            keep_columns=keep_columns,
        )  # fmt: skip
        self._no_targets = NoTargetWarning("PrePackedCollator", label_pad_id)

    @property
    def mode(self) -> Mode:
        return self.options.mode

    @property
    def max_length(self) -> int | None:
        return self.options.max_length

    def __repr__(self) -> str:
        kept = f", keep_columns={list(self.options.keep_columns)}" if self.options.keep_columns else ""
        return f"PrePackedCollator(mode={self.mode!r}, max_length={self.max_length}, {self.options.keywords()}{kept})"

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not len(rows):
            raise ValueError("PrePackedCollator got an empty batch (no rows).")
        tokens, row_lengths, segments, segments_per_row = self._read(rows)
        if self.mode == "flatten":
            batch = self.options.flat_batch(tokens, segments)
        else:
            batch = self._pad(tokens, row_lengths, segments, segments_per_row)
        self._no_targets.check(batch["labels"], examples=len(segments), tokens=int(row_lengths.sum()))
        batch.update(per_example_values(rows, self.options.keep_columns, segments_per_row))
        return self.options.finish(batch)

    def _read(self, rows):
        media = next(((i, k) for i, row in enumerate(rows) for k in MEDIA_KEYS if row.get(k) is not None), None)
        if media is not None:
            raise ValueError(
                f"Row {media[0]} has {media[1]!r}: pre-packed rows hold text only (pack_dataset refuses image "
                "columns). Collate vision-language examples online with FlatteningCollator (or PackingTrainer)."
            )
        _check_has_seq_lengths(rows)
        own = ("seq_lengths", *self.options.keep_columns)
        columns = read_columns(rows, collator="PrePackedCollator", item="Row", own=own)
        seq_column = feature_column(rows, "seq_lengths")
        segments_per_row = sequence_lengths(seq_column, what="seq_lengths", item="Row")
        segments = concat_tokens(seq_column, int(segments_per_row.sum()), what="seq_lengths", item="Row")
        _check_segments(segments, segments_per_row, columns.lengths)
        tokens = token_features(columns, collator="PrePackedCollator")
        return tokens, columns.lengths, segments, segments_per_row

    def _pad(self, tokens: TokenFeatures, row_lengths, segments, segments_per_row):
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
        target, shape = ranges(np.arange(num_rows) * width, row_lengths), (num_rows, width)
        labels = into_rows(tokens.labels, target, shape, self.options.label_pad_id)
        labels.reshape(-1)[layout.starts] = self.options.label_pad_id
        batch = {
            "input_ids": into_rows(tokens.input_ids, target, shape, self.options.pad_token_id),
            "labels": labels,
            "position_ids": layout.position_ids(self.options.position_ids_start).reshape(num_rows, width),
        }
        if self.options.return_seq_idx:
            seq_idx = layout.seq_idx().reshape(num_rows, width)
            batch[SEQ_IDX] = seq_idx - seq_idx[:, :1]
        for key, values in tokens.carried.items():
            batch[key] = into_rows(values, target, shape, 0)
        return batch


def _check_has_seq_lengths(rows: Sequence[Mapping[str, Any]]) -> None:
    """A row without ``seq_lengths`` cannot be split into its examples: say why it is gone, and the fix.

    >>> _check_has_seq_lengths([{"input_ids": [1, 2, 3]}])
    Traceback (most recent call last):
    ...
    ValueError: Example 0 has no 'seq_lengths' (its keys: ['input_ids']): PrePackedCollator needs it to keep the packed row's examples apart. The Trainer drops every column its model's forward does not take while remove_unused_columns=True (its default): pass TrainingArguments(..., remove_unused_columns=False), or train with PackingTrainer, which keeps seq_lengths. Rows not from pack_dataset: pack them with pack_dataset.
    """
    missing = next((i for i, row in enumerate(rows) if "seq_lengths" not in row), None)
    if missing is not None:
        raise ValueError(
            f"Example {missing} has no 'seq_lengths' (its keys: {sorted(rows[missing])}): PrePackedCollator needs it to "
            "keep the packed row's examples apart. The Trainer drops every column its model's forward does not take while "
            "remove_unused_columns=True (its default): pass TrainingArguments(..., remove_unused_columns=False), or "
            "train with PackingTrainer, which keeps seq_lengths. Rows not from pack_dataset: pack them with pack_dataset."
        )


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
        raise ValueError(
            f"Row {i}: seq_lengths has a length of {segments[nonpositive[0]]}; every segment needs at least one token."
        )
