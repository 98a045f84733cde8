"""Packing nothing: an empty result, said out loud (a warning), never an error.

    pack_dataset(Dataset.from_dict({"input_ids": []}), 8)    0 rows    UserWarning: ... no examples ...
    pack_dataset(iter([{"input_ids": []}] * 3), 8)           0 rows    UserWarning: ... 3 examples, all empty ...

An empty split is ordinary (a filter that kept nothing, a small shard, a test split), so it
packs to an empty dataset of the same kind and format, with ``input_ids``, ``position_ids`` and
``seq_lengths`` columns; the warning says so, because training on it would run no step
(``PackingTrainer`` and ``PackingCheckCallback`` refuse that). Cost: constant.
"""

from __future__ import annotations

import warnings

import pyarrow as pa

from ..engine import PackStats

__all__ = ["typed_empty", "warn_if_nothing_packed"]


def warn_if_nothing_packed(stats: PackStats, name: str = "") -> None:
    """Warn when the packing made no rows: no examples at all, or only empty ones.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_if_nothing_packed(PackStats("bfd", 8))
    >>> print(caught[0].message)
    pack_dataset: the dataset has no examples, so the result has no rows; training on it would run no step.
    """
    if stats.rows:
        return
    what = (
        "the dataset has no examples"
        if not stats.examples
        else f"the dataset's {stats.examples} examples are all empty or left out ({stats.summary()})"
    )
    warnings.warn(
        f"pack_dataset{name}: {what}, so the result has no rows; training on it would run no step.", stacklevel=3
    )


def typed_empty(table: pa.Table) -> pa.Table:
    """``table`` with its untyped columns as int64 lists: a null column of no rows
    (``Dataset.from_dict({"input_ids": []})``), or lists of nulls (``{"input_ids": [[], []]}``).

    >>> typed_empty(pa.table({"input_ids": pa.array([], pa.null())})).schema
    input_ids: list<item: int64>
      child 0, item: int64
    >>> typed_empty(pa.table({"input_ids": [[], []]})).column("input_ids").type
    ListType(list<item: int64>)
    """
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type) and not table.num_rows:
            table = table.set_column(i, field.name, pa.array([], pa.list_(pa.int64())))
        elif pa.types.is_list(field.type) and pa.types.is_null(field.type.value_type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.list_(pa.int64())))
    return table
