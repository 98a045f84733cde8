"""Example lengths from a ``datasets.Dataset``, read from its Arrow column in one pass.

A list column (``input_ids``) stores its rows as one flat value buffer plus offsets, so
the lengths are ``offsets[1:] - offsets[:-1]``: ``pyarrow.compute.list_value_length``
computes them without touching the tokens or building a Python object per row
(against a Python loop over the rows: ``benchmarks/cpu/bench_sampler.py``). A dataset
seen through ``select``/``shuffle``/``train_test_split`` (an indices mapping) gets its
lengths in that order, without flattening the mapping. :func:`example_lengths` is the one
reading of example lengths for any map-style dataset (``PackingTrainer`` calls it): the
Arrow column when there is one, else ``len(dataset[i][column])``, plus the vision patches of
an example with images (``_vision_cost.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat import dataset_indices
from ._vision_cost import vision_patches

__all__ = ["example_lengths", "lengths_from_dataset"]


def _arrow_table(dataset: Any):
    """The Arrow table behind ``dataset`` and its indices mapping (or None)."""
    import pyarrow as pa

    if isinstance(dataset, pa.Table):
        return dataset, None
    data = getattr(dataset, "data", None)
    table = getattr(data, "table", data)
    if not isinstance(table, pa.Table):
        raise TypeError(
            f"lengths_from_dataset needs a datasets.Dataset (or a pyarrow.Table), got {type(dataset).__name__}. "
            "An IterableDataset has no lengths before it is read: compute them while tokenizing "
            "(e.g. a 'length' column) and pass them to the sampler as a list."
        )
    return table, dataset_indices(dataset)


def lengths_from_dataset(dataset: Any, column: str = "input_ids") -> np.ndarray:
    """int64 (num_rows,) the length of each row's ``column`` (a list column), or the column itself if it holds integers.

    A ``seq_lengths`` or ``length`` column is not used unless you name it
    (``column="length"``): it may have been computed before truncation, while
    ``input_ids`` is what the collator will see, and reading it costs about the same.

    >>> from datasets import Dataset
    >>> ds = Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]], "length": [3, 1, 2]})
    >>> lengths_from_dataset(ds).tolist(), lengths_from_dataset(ds.select([2, 0])).tolist()
    ([3, 1, 2], [2, 3])
    >>> lengths_from_dataset(ds, column="length").tolist()
    [3, 1, 2]
    >>> lengths_from_dataset(ds, column="labels")
    Traceback (most recent call last):
    ...
    ValueError: The dataset has no column 'labels' (its columns: ['input_ids', 'length']); tokenize it first, or pass column= with the tokenized column.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table, indices = _arrow_table(dataset)
    if column not in table.column_names:
        raise ValueError(
            f"The dataset has no column {column!r} (its columns: {table.column_names}); "
            "tokenize it first, or pass column= with the tokenized column."
        )
    values = table.column(column)
    kind = values.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        values = pc.list_value_length(values)
    elif not pa.types.is_integer(kind):
        raise TypeError(
            f"Column {column!r} holds {kind}; it must be a list column (token ids) or an integer column (lengths)."
        )
    if values.null_count:
        row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"Row {row} has no {column!r} (null); fill or filter it before computing lengths.")
    lengths = values.to_numpy().astype(np.int64, copy=False)
    if indices is not None:
        lengths = lengths[indices.column(0).to_numpy()]
    return lengths


def example_lengths(dataset: Any, column: str = "input_ids", *, reader: str = "PackingTrainer") -> np.ndarray:
    """int64 (n,) tokens per example of any map-style dataset: :func:`lengths_from_dataset` for a
    ``datasets.Dataset``, else ``len(dataset[i][column])`` for each example (``reader`` names the caller in errors);
    an example with images or videos (``image_grid_thw`` / ``video_grid_thw``) also counts its vision patches.

    >>> example_lengths([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}]).tolist()
    [3, 1]
    >>> example_lengths([{"text": "hi"}])
    Traceback (most recent call last):
    ...
    ValueError: PackingTrainer reads example lengths from the 'input_ids' column, which dataset[0] lacks (KeyError('input_ids')); tokenize the dataset first, or pass length_column= with the tokenized column.
    """
    lengths = _token_lengths(dataset, column, reader)
    try:
        table, indices = _arrow_table(dataset)
    except TypeError:  # not Arrow-backed: each example's grids
        table, indices = None, None
    order = None if indices is None else indices.column(0).to_numpy()
    return lengths + vision_patches(dataset, len(lengths), table, order)  # a VLM's images cost their patches too


def _token_lengths(dataset: Any, column: str, reader: str) -> np.ndarray:
    try:
        import datasets

        if isinstance(dataset, datasets.Dataset):
            return lengths_from_dataset(dataset, column)
    except ImportError:  # pragma: no cover
        pass
    try:
        return np.fromiter((len(dataset[i][column]) for i in range(len(dataset))), dtype=np.int64, count=len(dataset))
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"{reader} reads example lengths from the {column!r} column, which dataset[0] lacks "
            f"({error!r}); tokenize the dataset first, or pass length_column= with the tokenized column."
        ) from None
