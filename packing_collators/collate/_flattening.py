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

from typing import Any, Mapping, Sequence

import numpy as np

from ._concat import concat_tokens, sequence_lengths
from ._features import check_same_lengths, check_unpadded, feature_column, to_tensors
from ._options import CollateOptions, ReturnTensors

__all__ = ["FlatteningCollator"]


class FlatteningCollator:
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
        self.options = CollateOptions.pick(locals())

    def __repr__(self) -> str:
        return f"FlatteningCollator({self.options.keywords()})"

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not len(features):
            raise ValueError("FlatteningCollator got an empty batch (no examples).")
        ids = feature_column(features, "input_ids")
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
            labels_column = feature_column(features, "labels")
            check_same_lengths(sequence_lengths(labels_column, what="labels"), lengths, "labels")
            labels = concat_tokens(labels_column, total, what="labels")
        else:
            labels = input_ids.copy()
        if "attention_mask" in features[0]:
            check_unpadded(features, lengths)
        return to_tensors(self.options.flat_batch(input_ids, labels, lengths), self.options.return_tensors)
