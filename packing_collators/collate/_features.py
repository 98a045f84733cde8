"""What the collators read from a batch's features, checked: columns, lengths, padding, tensors.

For features ``[{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9]}]``::

    feature_column(features, "input_ids")   [[5, 6, 7], [8, 9]]
    feature_column(features, "labels")      ValueError: Example 1 has no 'labels' ...
    check_same_lengths([3, 1], [3, 2], "labels")   ValueError: Example 1: labels has 1 tokens but input_ids has 2 ...

Every check names the example (or row), the key, the value and the fix. Cost: one pass
over the keys per example and vectorised numpy over the tokens.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ._concat import concat_tokens, sequence_lengths

__all__ = ["check_same_lengths", "check_unpadded", "feature_column", "to_tensors"]


def feature_column(features: Sequence[Mapping[str, Any]], key: str) -> list:
    """The values of ``key`` in every example, or an error naming the first example without it.

    >>> feature_column([{"input_ids": [1, 2]}, {"input_ids": [3]}], "input_ids")
    [[1, 2], [3]]
    """
    try:
        return [feature[key] for feature in features]
    except KeyError:
        missing = next(i for i, feature in enumerate(features) if key not in feature)
        raise ValueError(
            f"Example {missing} has no {key!r} (its keys: {sorted(features[missing])}); "
            f"every example in a batch needs {key!r} when the first one has it."
        ) from None


def check_unpadded(features, lengths: np.ndarray) -> None:
    """Refuse examples whose attention_mask has zeros: their pad tokens would be trained on."""
    masks = feature_column(features, "attention_mask")
    mask_lengths = sequence_lengths(masks, what="attention_mask")
    check_same_lengths(mask_lengths, lengths, "attention_mask")
    flat = concat_tokens(masks, int(mask_lengths.sum()), what="attention_mask")
    if not flat.all():
        token = int(np.flatnonzero(flat == 0)[0])
        example = int(np.searchsorted(np.cumsum(lengths), token, side="right"))
        raise ValueError(
            f"Example {example} has attention_mask zeros (padding inside the example); flattening "
            "would train on its pad tokens. Tokenize without padding (padding=False) or strip it first."
        )


def check_same_lengths(other: np.ndarray, lengths: np.ndarray, key: str, item: str = "Example") -> None:
    """Raise a ValueError naming the first example whose ``key`` is not as long as its input_ids.

    >>> check_same_lengths(np.array([3, 1]), np.array([3, 2]), "labels")
    Traceback (most recent call last):
    ...
    ValueError: Example 1: labels has 1 tokens but input_ids has 2; they must be the same length.
    """
    bad = np.flatnonzero(other != lengths)
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"{item} {i}: {key} has {other[i]} tokens but input_ids has {lengths[i]}; they must be the same length."
        )


def to_tensors(batch: dict[str, Any], return_tensors: str) -> dict[str, Any]:
    """numpy arrays to torch tensors (zero-copy) when ``return_tensors == "pt"``."""
    if return_tensors == "np":
        return batch
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
