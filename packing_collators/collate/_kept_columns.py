"""Per-example columns of packed rows (``pack_dataset(keep_columns=...)``), one value per example in a batch.

Two rows of ``seq_lengths`` ``[3, 2]`` and ``[4]``, kept column ``source``::

    rows     {"seq_lengths": [3, 2], "source": ["web", "math"]}, {"seq_lengths": [4], "source": ["code"]}
    batch    "source": ["web", "math", "code"]        one per segment, in cu_seq_lens order
    numbers  "id": [[7, 8], [9]] -> int64 (3,)         floats keep their dtype; anything else stays a list

Cost: a Python pass over the kept values (one per example, not per token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["per_example_values"]


def _missing(rows: Sequence[Mapping[str, Any]], name: str) -> bool:
    """Whether no row has ``name`` (then the batch has none either: the probe's synthetic rows); some rows only: an error."""
    has = [r.get(name) is not None for r in rows]
    if not any(has):
        return True
    if all(has):
        return False
    row = has.index(False)
    raise ValueError(
        f"Row {row} has no {name!r} (its keys: {sorted(rows[row])}) but row {has.index(True)} has; a batch cannot mix "
        f"them. Give every row its {name!r} (pack_dataset(keep_columns=[{name!r}]) does), or none."
    )


def _row_values(value: Any, row: int, name: str, examples: int) -> list:
    """One row's kept values as a list, checked to hold one value per example of the row."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        raise ValueError(
            f"Row {row}: {name!r} is {str(value)[:50]} ({type(value).__name__}), not a list of one value per example "
            "(pack_dataset's keep_columns store one per example in each row). Pack with keep_columns, or remove it."
        )
    values = value.tolist() if hasattr(value, "tolist") else list(value)
    if len(values) != examples:
        raise ValueError(
            f"Row {row}: {name!r} has {len(values)} values but the row holds {examples} examples (its seq_lengths); "
            "a keep_columns column holds one value per example. Pack the rows with pack_dataset(keep_columns=...)."
        )
    return values


def _as_batch_value(values: list) -> Any:
    """int64 (n,) for integers (bools too), the float dtype for floats, else the list as it is."""
    if not values or any(isinstance(v, (str, bytes)) or v is None for v in values):
        return values
    array = np.asarray(values)
    if array.ndim == 1 and array.dtype.kind in "iub":
        return array.astype(np.int64)
    if array.ndim == 1 and array.dtype.kind == "f":
        return array
    return values


def per_example_values(
    rows: Sequence[Mapping[str, Any]], names: Sequence[str], segments_per_row: np.ndarray
) -> dict[str, Any]:
    """Each of ``names``: the rows' per-example values end to end, one per segment of the batch.

    A name no row has is left out of the batch (rows without it: the live probe's synthetic rows, or a
    Trainer with ``remove_unused_columns=True``, which drops every column its model's forward does not take).

    >>> rows = [{"seq_lengths": [3, 2], "source": ["web", "math"], "id": [7, 8]},
    ...         {"seq_lengths": [4], "source": ["code"], "id": [9]}]
    >>> kept = per_example_values(rows, ["source", "id"], np.array([2, 1]))
    >>> kept["source"], kept["id"].tolist(), kept["id"].dtype
    (['web', 'math', 'code'], [7, 8, 9], dtype('int64'))
    >>> per_example_values(rows, ["source"], np.array([2, 2]))
    Traceback (most recent call last):
    ...
    ValueError: Row 1: 'source' has 1 values but the row holds 2 examples (its seq_lengths); a keep_columns column holds one value per example. Pack the rows with pack_dataset(keep_columns=...).
    """
    kept = {}
    for name in names:
        if _missing(rows, name):
            continue
        values = [
            value for i, row in enumerate(rows) for value in _row_values(row[name], i, name, int(segments_per_row[i]))
        ]
        kept[name] = _as_batch_value(values)
    return kept
