"""Online minibatch flattening: a minibatch of examples becomes one packed row.

Three examples ``S1 = [a, b, c]``, ``S2 = [d, e]``, ``S3 = [f, g, h]``::

    input_ids     = [[ a,    b, c,  d,    e,  f,    g, h]]     int64 (1, T)
    labels        = [[-100,  b, c, -100,  e, -100,  g, h]]     int64 (1, T)
    position_ids  = [[ 0,    1, 2,  0,    1,  0,    1, 2]]     int64 (1, T)
    cu_seq_lens_q = cu_seq_lens_k = [0, 3, 5, 8]               int32 (n + 1,)
    max_length_q  = max_length_k  = 3                          int
    seq_idx       = [[ 0,    0, 0,  1,    1,  2,    2, 2]]     int32 (1, T), optional

The first label of every example is -100: in a causal LM it would be predicted
from the previous example's last token; in a padded batch it is never used
either, so the loss is exactly the padded loss. ``position_ids`` restart at 0,
which is what flash-attention (and transformers' packed-sequence masks) use to
keep examples from attending to each other. No ``attention_mask`` is returned.

Cost: one concatenation and a few vectorised numpy ops per batch; no Python
loop over tokens (``benchmarks/bench_collator.py``).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import numpy as np

from ._engine import validate_choice, validate_positive_int
from ._layout import SegmentLayout, segment_layout
from ._tokens import concat_tokens, sequence_lengths

__all__ = ["FlatteningCollator", "flat_batch"]

ReturnTensors = Literal["pt", "np"]


def _column(features: Sequence[Mapping[str, Any]], key: str) -> list:
    try:
        return [feature[key] for feature in features]
    except KeyError:
        missing = next(i for i, feature in enumerate(features) if key not in feature)
        raise ValueError(
            f"Example {missing} has no {key!r} (its keys: {sorted(features[missing])}); "
            f"every example in a batch needs {key!r} when the first one has it."
        ) from None


def _check_unpadded(features, lengths: np.ndarray) -> None:
    """Refuse examples whose attention_mask has zeros: their pad tokens would be trained on."""
    masks = _column(features, "attention_mask")
    mask_lengths = sequence_lengths(masks, what="attention_mask")
    _check_same_lengths(mask_lengths, lengths, "attention_mask")
    flat = concat_tokens(masks, int(mask_lengths.sum()), what="attention_mask")
    if not flat.all():
        token = int(np.flatnonzero(flat == 0)[0])
        example = int(np.searchsorted(np.cumsum(lengths), token, side="right"))
        raise ValueError(
            f"Example {example} has attention_mask zeros (padding inside the example); flattening "
            "would train on its pad tokens. Tokenize without padding (padding=False) or strip it first."
        )


def _check_same_lengths(other: np.ndarray, lengths: np.ndarray, key: str, item: str = "Example") -> None:
    bad = np.flatnonzero(other != lengths)
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"{item} {i}: {key} has {other[i]} tokens but input_ids has {lengths[i]}; they must be the same length."
        )


class FlatOptions:
    """The options :class:`FlatteningCollator` and :class:`PrePackedCollator` share, validated then stored."""

    def __init__(
        self,
        *,
        pad_to_multiple_of: int | None = None,
        pad_token_id: int = 0,
        return_tensors: ReturnTensors = "pt",
        position_ids_start: int = 0,
        return_seq_idx: bool = False,
        label_pad_id: int = -100,
    ) -> None:
        validate_choice("return_tensors", return_tensors, ReturnTensors)
        validate_positive_int("pad_to_multiple_of", pad_to_multiple_of, allow_none=True)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_token_id = pad_token_id
        self.return_tensors = return_tensors
        self.position_ids_start = position_ids_start
        self.return_seq_idx = return_seq_idx
        self.label_pad_id = label_pad_id

    def _flat_batch(self, input_ids: np.ndarray, labels: np.ndarray, segments: np.ndarray) -> dict[str, Any]:
        """One flat row of these segments with these options: padded to ``pad_to_multiple_of``, numpy."""
        input_ids, labels, segments = pad_to_multiple(
            input_ids, labels, segments, self.pad_to_multiple_of, self.pad_token_id, self.label_pad_id
        )
        return flat_batch(
            input_ids,
            labels,
            segment_layout(segments),
            position_ids_start=self.position_ids_start,
            label_pad_id=self.label_pad_id,
            return_seq_idx=self.return_seq_idx,
        )

    def _options_repr(self) -> str:
        return (
            f"pad_to_multiple_of={self.pad_to_multiple_of}, pad_token_id={self.pad_token_id}, "
            f"return_tensors={self.return_tensors!r}, position_ids_start={self.position_ids_start}, "
            f"return_seq_idx={self.return_seq_idx}, label_pad_id={self.label_pad_id}"
        )


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


def to_tensors(batch: dict[str, Any], return_tensors: str) -> dict[str, Any]:
    """numpy arrays to torch tensors (zero-copy) when ``return_tensors == "pt"``."""
    if return_tensors == "np":
        return batch
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


class FlatteningCollator(FlatOptions):
    """Flatten a minibatch of examples into one packed row (``data_collator=`` for a Trainer).

    Args:
        pad_to_multiple_of: pad the row's length to a multiple of this (for
            ``torch.compile`` shape buckets). The padding is a segment of its own
            (positions restart, labels -100), so no example attends to it.
        pad_token_id: token id used for that padding.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        position_ids_start: first position of every example (2 for RoBERTa-style models).
        return_seq_idx: also return ``seq_idx`` (for Mamba-style / linear-attention models).
        label_pad_id: label given to each example's first token and to padding.

    Input features need ``input_ids`` and may have ``labels`` (kept as given,
    so completion-only masks survive) and an all-ones ``attention_mask``
    (which is checked, then not returned). Lists, numpy arrays and tensors work.

    Returns (``T`` = tokens in the batch, ``n`` = examples, +1 each with padding):
        ``input_ids`` int64 (1, T), ``labels`` int64 (1, T), ``position_ids`` int64 (1, T),
        ``cu_seq_lens_q`` / ``cu_seq_lens_k`` int32 (n + 1,), ``max_length_q`` /
        ``max_length_k`` int, and ``seq_idx`` int32 (1, T) if asked for.

    >>> collate = FlatteningCollator(return_tensors="np")
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist(), batch["position_ids"].tolist()
    ([[1, 2, 3, 4, 5]], [[-100, 2, 3, -100, 5]], [[0, 1, 2, 0, 1]])
    >>> batch["cu_seq_lens_q"].tolist(), batch["max_length_q"]
    ([0, 3, 5], 3)
    >>> FlatteningCollator(pad_to_multiple_of=4, return_tensors="np")([{"input_ids": [7, 8, 9]}])["position_ids"]
    array([[0, 1, 2, 0]])
    """

    # __init__ is FlatOptions': the keyword-only options above, validated, then stored.

    def __repr__(self) -> str:
        return f"FlatteningCollator({self._options_repr()})"

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not len(features):
            raise ValueError("FlatteningCollator got an empty batch (no examples).")
        ids = _column(features, "input_ids")
        lengths = sequence_lengths(ids)
        empty = np.flatnonzero(lengths == 0)
        if len(empty):
            raise ValueError(
                f"Example {int(empty[0])} has no tokens ({len(empty)} empty example(s) in this batch). "
                "Filter empty examples out of the dataset before training."
            )
        total = int(lengths.sum())
        input_ids = concat_tokens(ids, total)
        if "labels" in features[0]:
            labels_column = _column(features, "labels")
            _check_same_lengths(sequence_lengths(labels_column, what="labels"), lengths, "labels")
            labels = concat_tokens(labels_column, total, what="labels")
        else:
            labels = input_ids.copy()
        if "attention_mask" in features[0]:
            _check_unpadded(features, lengths)
        return to_tensors(self._flat_batch(input_ids, labels, lengths), self.return_tensors)
