"""Online minibatch flattening: a minibatch of examples becomes one packed row.

Three examples ``S1 = [a, b, c]``, ``S2 = [d, e]``, ``S3 = [f, g, h]``::

    input_ids     = [[ a,    b, c,  d,    e,  f,    g, h]]     int64 (1, T)
    labels        = [[-100,  b, c, -100,  e, -100,  g, h]]     int64 (1, T)
    position_ids  = [[ 0,    1, 2,  0,    1,  0,    1, 2]]     int64 (1, T)
    cu_seq_lens_q = cu_seq_lens_k = [0, 3, 5, 8]               int32 (n + 1,)
    max_length_q  = max_length_k  = 3                          int
    seq_idx       = [[ 0,    0, 0,  1,    1,  2,    2, 2]]     int32 (1, T), optional
    token_type_ids (any other per-token key, if given)         int64 (1, T), like input_ids
    pixel_values, image_grid_thw (videos too), if given        each example's, concatenated in order
    images_per_example (videos_per_example), with them         int64 (n,): each example's image count
    use_cache     = False                                      bool (no KV cache: see below)

The first label of every example is -100: in a causal LM it would be predicted
from the previous example's last token; in a padded batch it is never used
either, so the loss is exactly the padded loss. ``position_ids`` restart at 0,
which is what flash-attention (and transformers' packed-sequence masks) use to
keep examples from attending to each other. No ``attention_mask`` is returned.
``use_cache=False`` keeps a model whose config says ``use_cache=True`` (transformers'
default) from building a KV cache, which would switch those masks off.
Every key of every example is read: a per-token key is carried, anything else refused.

Cost: one concatenation and a few vectorised numpy ops per batch; no Python
loop over tokens (``benchmarks/cpu/bench_collator.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._concat import token_features
from ._features import read_columns
from ._media import MEDIA_KEYS, read_media
from ._no_targets import NoTargetWarning
from ._options import CollateOptions, ReturnTensors

__all__ = ["FlatteningCollator"]


class FlatteningCollator:
    """Flatten a minibatch of examples into one packed row (``data_collator=`` for a Trainer).

    Args:
        pad_to_multiple_of: pad the row's length to a multiple of this (for
            ``torch.compile`` shape buckets). The padding is a segment of its own
            (positions restart, labels -100), so no example attends to it.
        pad_to_buckets: pad the row to the smallest of these lengths that holds it (e.g.
            ``length_buckets(16384)``), so that a compiled model sees a few shapes only; a
            batch longer than the largest is a ValueError. Padding as for ``pad_to_multiple_of``
            (applied first; every bucket must be a multiple of it).
        pad_token_id: token id used for that padding.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        position_ids_start: first position of every example (2 for RoBERTa-style models).
        return_seq_idx: also return ``seq_idx`` (for Mamba-style / linear-attention models).
        label_pad_id: label given to each example's first token and to padding.
        disable_cache: put ``use_cache=False`` in every batch (default True), so a model whose
            config keeps transformers' default ``use_cache=True`` builds no KV cache in training (a
            cache switches off the packed-sequence masks of sdpa/eager/flex, and the examples of a
            row would attend to each other). Every transformers causal LM's forward takes it; pass
            False only for a model whose forward does not (then set its config's use_cache off).

    Input features need ``input_ids``, and may have ``labels`` (kept as given, so
    completion-only masks survive; every example has them or none does, which trains
    every token), an ``attention_mask`` (checked to be all ones in every example that
    has one, then not returned) and ``position_ids`` (rebuilt). Any other key with one
    entry per token (``token_type_ids``, ``special_tokens_mask``, ...) is carried,
    concatenated like ``input_ids``; a key that is not per-token (a number, a string,
    a list of another length) is a ValueError naming the example and the fix, and a
    key whose value is None is skipped. Every token value must be an integer (a float,
    string or None is a TypeError); lists, numpy arrays and tensors work. Images and videos of
    processor-style examples (``pixel_values`` + ``image_grid_thw``, ``pixel_values_videos`` +
    ``video_grid_thw``, ``second_per_grid_ts``) are concatenated in example order, text-only
    examples mixed in freely (``mm_token_type_ids`` is per token, carried); the model needs
    ``enable_packing(model)`` to number each example's multimodal positions on its own.

    Returns (``T`` = tokens in the batch, ``n`` = examples, +1 each with padding):
        ``input_ids`` int64 (1, T), ``labels`` int64 (1, T), ``position_ids`` int64 (1, T),
        ``cu_seq_lens_q`` / ``cu_seq_lens_k`` int32 (n + 1,), ``max_length_q`` /
        ``max_length_k`` int, ``seq_idx`` int32 (1, T) if asked for, and each carried
        per-token key (e.g. ``token_type_ids``) int64 (1, T), 0 in the padding; the image and
        video keys given, concatenated (``pixel_values`` (patches, features), ``image_grid_thw``
        int64 (images, 3)), with ``images_per_example`` (``videos_per_example``) int64 (n,): how
        many of them each example holds (``enable_packing`` checks each example against its own).
        And ``use_cache`` False, last (unless ``disable_cache=False``).

    >>> collate = FlatteningCollator(return_tensors="np")
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist(), batch["position_ids"].tolist()
    ([[1, 2, 3, 4, 5]], [[-100, 2, 3, -100, 5]], [[0, 1, 2, 0, 1]])
    >>> batch["cu_seq_lens_q"].tolist(), batch["max_length_q"]
    ([0, 3, 5], 3)
    >>> FlatteningCollator(pad_to_multiple_of=4, return_tensors="np")([{"input_ids": [7, 8, 9]}])["position_ids"]
    array([[0, 1, 2, 0]])
    >>> bucketed = FlatteningCollator(pad_to_buckets=[4, 8], return_tensors="np")([{"input_ids": [1, 2, 3, 4, 5]}])
    >>> bucketed["input_ids"].tolist(), bucketed["labels"].tolist(), bucketed["cu_seq_lens_q"].tolist()
    ([[1, 2, 3, 4, 5, 0, 0, 0]], [[-100, 2, 3, 4, 5, -100, -100, -100]], [0, 5, 8])
    >>> collate([{"input_ids": [1, 2], "token_type_ids": [0, 1]}, {"input_ids": [3], "token_type_ids": [1]}])["token_type_ids"]
    array([[0, 1, 1]])
    >>> collate([{"input_ids": [1, 2], "source": "web"}])
    Traceback (most recent call last):
    ...
    ValueError: Example 0: 'source' is 'web' (str), not a list with one entry per token (input_ids has 2 tokens). FlatteningCollator carries only per-token keys; remove this column before collating: remove_unused_columns=True (the Trainer's default) drops the columns the model does not take, or dataset.remove_columns(['source']).
    """

    def __init__(
        self,
        *,
        pad_to_multiple_of: int | None = None,
        pad_to_buckets: Sequence[int] | None = None,
        pad_token_id: int = 0,
        return_tensors: ReturnTensors = "pt",
        position_ids_start: int = 0,
        return_seq_idx: bool = False,
        label_pad_id: int = -100,
        disable_cache: bool = True,
    ) -> None:
        self.options = CollateOptions(
            pad_to_multiple_of=pad_to_multiple_of, pad_to_buckets=pad_to_buckets, pad_token_id=pad_token_id,
            return_tensors=return_tensors, position_ids_start=position_ids_start, return_seq_idx=return_seq_idx,
            label_pad_id=label_pad_id, disable_cache=disable_cache,
        )  # fmt: skip
        self._no_targets = NoTargetWarning("FlatteningCollator", label_pad_id)

    def __repr__(self) -> str:
        return f"FlatteningCollator({self.options.keywords()})"

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not len(features):
            raise ValueError("FlatteningCollator got an empty batch (no examples).")
        columns = read_columns(features, collator="FlatteningCollator", own=MEDIA_KEYS)
        empty = np.flatnonzero(columns.lengths == 0)
        if len(empty):
            raise ValueError(
                f"Example {int(empty[0])} of this batch (its place among the batch's {len(columns.lengths)}, in the "
                f"sampler's order) has no tokens ({len(empty)} empty example(s) in this batch). Filter empty examples "
                "out of the dataset before training (dataset.filter(lambda e: len(e['input_ids']) > 0))."
            )
        tokens = token_features(columns, collator="FlatteningCollator")
        media = read_media(features)
        batch = self.options.flat_batch(tokens, columns.lengths)
        self._no_targets.check(batch["labels"], examples=len(columns.lengths), tokens=len(tokens.input_ids))
        return self.options.finish({**batch, **media})
