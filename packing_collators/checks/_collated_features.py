"""check_collated_features: does the collator keep apart the examples the dataset keeps apart?

    features  [A A A] [B B | C C C]   (the second pre-packed: seq_lengths [2, 3])
    batch     [A A A B B C C C]  cu_seq_lens_q [0 3 5 8]      every example start is a segment start

Cost: a few numpy ops over the first batch's starts, once before training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..batch import segment_starts
from ._batch_checks import numpy_of

__all__ = ["check_collated_features"]


def _inner_starts(feature) -> np.ndarray:
    """Where examples start inside one feature: 0, and inside a pre-packed row (seq_lengths / position_ids)."""
    if feature.get("seq_lengths") is not None:
        inner = np.cumsum(numpy_of(feature["seq_lengths"]))[:-1]
    elif feature.get("position_ids") is not None:
        positions = numpy_of(feature["position_ids"]).reshape(1, -1)
        inner = np.flatnonzero(numpy_of(segment_starts({"position_ids": positions}, positions.shape))[0, 1:]) + 1
    else:
        inner = np.empty(0, np.int64)
    return np.r_[0, inner].astype(np.int64)


def _row_starts(batch: Mapping[str, Any], row: int) -> np.ndarray:
    """Where examples start in one row of the collated batch, by the batch's rule (``packing_collators.batch``)."""
    return np.flatnonzero(numpy_of(segment_starts(batch))[row])


def _joined_error(token: int, row: int | None, have: np.ndarray, prepacked: bool) -> ValueError:
    where = f"token {token} of the batch" if row is None else f"token {token} of row {row}"
    hint = (
        " The dataset looks pre-packed (rows carry position_ids or seq_lengths, e.g. from pack_dataset), and this "
        "collator dropped what separates a row's examples (as transformers' DataCollatorWithPadding and TRL's default "
        "collator do) or treats each row as one example. Collate with PrePackedCollator, or train on the unpacked "
        "dataset (FlatteningCollator / PackingTrainer pack it per batch)."
        if prepacked
        else " Use FlatteningCollator, which starts a segment at every example."
    )
    return ValueError(
        f"The collator joined examples that the dataset keeps apart: an example starts at {where}, but the batch has "
        f"no boundary there (its segments start at {have.tolist()[:8]})." + hint
    )


def check_collated_features(features, batch: Mapping[str, Any]) -> None:
    """Raise a ValueError if the collated ``batch`` joins examples that ``features`` keep apart.

    Every feature starts an example, and a pre-packed feature (``seq_lengths`` or
    restarting ``position_ids``, as ``pack_dataset`` writes) starts several; each of
    those starts must start a segment of the batch too: of its one flattened row
    (``cu_seq_lens`` or restarting ``position_ids``), or, when the batch has a row per
    feature, of that feature's row (restarting ``position_ids``). A batch whose rows do
    not map to the features (neither one row nor one per feature) is not checked.

    >>> prepacked = [{"input_ids": [1, 2, 3, 4], "position_ids": [0, 1, 0, 1]}]
    >>> check_collated_features(prepacked, {"input_ids": np.zeros((1, 4)), "cu_seq_lens_q": np.array([0, 2, 4])})
    >>> check_collated_features(prepacked * 2, {"input_ids": np.zeros((2, 4)), "attention_mask": np.ones((2, 4))})
    Traceback (most recent call last):
    ...
    ValueError: The collator joined examples that the dataset keeps apart: an example starts at token 2 of row 0, but the batch has no boundary there (its segments start at [0]). The dataset looks pre-packed (rows carry position_ids or seq_lengths, e.g. from pack_dataset), and this collator dropped what separates a row's examples (as transformers' DataCollatorWithPadding and TRL's default collator do) or treats each row as one example. Collate with PrePackedCollator, or train on the unpacked dataset (FlatteningCollator / PackingTrainer pack it per batch).
    """
    ids = batch.get("input_ids")
    if ids is None or numpy_of(ids).ndim != 2:
        return
    rows = numpy_of(ids).shape[0]
    prepacked = any(f.get("seq_lengths") is not None or f.get("position_ids") is not None for f in features)
    if rows == 1:
        lengths = [len(f["input_ids"]) for f in features]
        offsets = np.r_[0, np.cumsum(lengths)[:-1]]
        want = np.concatenate([_inner_starts(f) + o for f, o in zip(features, offsets)]) if features else np.zeros(0)
        have = _row_starts(batch, 0)
        missing = np.setdiff1d(want, have)
        if len(missing):
            raise _joined_error(int(missing[0]), None, have, prepacked)
    elif rows == len(features):
        for row, feature in enumerate(features):
            have = _row_starts(batch, row)
            missing = np.setdiff1d(_inner_starts(feature), have)
            if len(missing):
                raise _joined_error(int(missing[0]), row, have, prepacked)
