"""Which columns of an Arrow table of examples can be packed, and how: checked before any work.

Three kinds of column::

    input_ids       [[5, 6, 7], [8, 9]]         per token: concatenated into rows (lengths must match)
    attention_mask  [[1, 1, 1], [1, 1]]         per token too (any list of numbers or bools); it must be
                                                all ones: an example with zeros is padded, and refused
    source          ["web", "math"]             per example: kept as a list per row, only if named
                                                in ``keep_columns``; otherwise an error

Nothing is dropped silently: a column that is neither per-token nor named is
refused with the fix. :func:`read_examples` runs every check in order (columns, lengths,
padding): the one way a table of examples is read. Cost: one ``list_value_length`` per per-token column, and one
vectorised comparison with 0 over the ``attention_mask`` values (a bit per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._validation import check_unpadded

__all__ = [
    "ExampleColumns",
    "RESERVED_COLUMNS",
    "check_non_negative_ids",
    "example_columns",
    "is_per_token",
    "read_examples",
    "table_zero_owners",
    "token_lengths",
]

RESERVED_COLUMNS = ("position_ids", "seq_lengths")


@dataclass(frozen=True)
class ExampleColumns:
    """The packable columns: ``tokens`` (``input_ids`` first), ``labels`` among them or None, ``keep``."""

    tokens: tuple[str, ...]
    labels: str | None
    keep: tuple[str, ...]


def is_per_token(dtype: pa.DataType) -> bool:
    """Whether a column of this Arrow type holds one number per token (a list of numbers), so it packs.

    >>> is_per_token(pa.list_(pa.int32())), is_per_token(pa.string())
    (True, False)
    """
    if not (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)):
        return False
    value = dtype.value_type
    return pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_boolean(value)


# a processor's per-image / per-video keys (collate/_media.py carries them, online)
MEDIA_COLUMNS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def example_columns(schema: pa.Schema, keep_columns: Sequence[str] = ()) -> ExampleColumns:
    """Classify a table's columns, or raise an error that says how to fix them.

    >>> schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int64())),
    ...                     ("source", pa.string())])
    >>> example_columns(schema, keep_columns=["source"])
    ExampleColumns(tokens=('input_ids', 'labels'), labels='labels', keep=('source',))
    >>> example_columns(schema)
    Traceback (most recent call last):
    ...
    ValueError: Column 'source' (string) is not a per-token column, so it cannot be concatenated into packed rows. Name it in keep_columns=['source'] to keep its values as a list per row, or remove it first (dataset.remove_columns(['source'])).
    """
    names = list(schema.names)
    if isinstance(keep_columns, str):
        keep_columns = [keep_columns]
    if "input_ids" not in names:
        raise ValueError(
            f"The dataset has no 'input_ids' column (its columns: {names}). Tokenize it first, e.g. "
            "dataset.map(lambda ex: tokenizer(ex['text']), remove_columns=['text'])."
        )
    for name in RESERVED_COLUMNS:
        if name in names:
            raise ValueError(
                f"The dataset already has a {name!r} column; pack_dataset writes it, so the dataset looks packed "
                f"already. Pack unpacked examples, or remove it first (dataset.remove_columns([{name!r}]))."
            )
    media = [name for name in names if name in MEDIA_COLUMNS]
    if media:
        raise ValueError(
            f"The dataset has image or video columns ({media}): pack_dataset packs text, and a packed row would "
            "need each example's images kept beside its tokens. Pack a vision-language dataset online: "
            "FlatteningCollator (or PackingTrainer) collates processor-style examples, images included, and "
            "enable_packing(model) keeps each example's positions and images apart."
        )
    unknown = [name for name in keep_columns if name not in names]
    if unknown:
        raise ValueError(f"keep_columns names {unknown}, which the dataset does not have (its columns: {names}).")
    if "input_ids" in keep_columns:
        raise ValueError("keep_columns cannot name 'input_ids': it is always packed per token.")
    tokens = []
    for name in names:
        dtype = schema.field(name).type
        if name in keep_columns:
            continue
        if not is_per_token(dtype):
            raise ValueError(
                f"Column {name!r} ({dtype}) is not a per-token column, so it cannot be concatenated into packed "
                f"rows. Name it in keep_columns=[{name!r}] to keep its values as a list per row, or remove it "
                f"first (dataset.remove_columns([{name!r}]))."
            )
        tokens.append(name)
    for name in ("input_ids", "labels"):
        if name in tokens and not pa.types.is_integer(schema.field(name).type.value_type):
            raise TypeError(f"Column {name!r} must hold integer token ids, got {schema.field(name).type}.")
    tokens.sort(key=lambda name: (name != "input_ids", name != "labels"))
    return ExampleColumns(tuple(tokens), "labels" if "labels" in tokens else None, tuple(keep_columns))


def _first_null(column: pa.ChunkedArray) -> int:
    return int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])


def token_lengths(table: pa.Table, columns: ExampleColumns, *, first_index: int = 0) -> np.ndarray:
    """int64 (n,) tokens per example, after checking every per-token column matches ``input_ids``.

    Errors number the examples from ``first_index`` (where the table starts in a stream).

    >>> table = pa.table({"input_ids": [[1, 2, 3], [4]], "attention_mask": [[1, 1, 1], [1, 1]]})
    >>> token_lengths(table, example_columns(table.schema))
    Traceback (most recent call last):
    ...
    ValueError: Example 1: attention_mask has 2 values but input_ids has 1 tokens; every per-token column must have one value per token (or name 'attention_mask' in keep_columns to keep it per example).
    """
    lengths = None
    for name in columns.tokens:
        column = table.column(name)
        if column.null_count:
            i = _first_null(column)
            raise ValueError(f"Example {first_index + i} has no {name} (null); drop it or give it a list of values.")
        values_nulls = sum(chunk.flatten().null_count for chunk in column.chunks)
        if values_nulls:
            raise ValueError(
                f"Column {name!r} has {values_nulls} null value(s) inside its lists; fill or drop them first."
            )
        column_lengths = pc.list_value_length(column).to_numpy().astype(np.int64)
        if lengths is None:
            check_non_negative_ids(column, first_index=first_index)
            lengths = column_lengths
            continue
        bad = np.flatnonzero(column_lengths != lengths)
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"Example {first_index + i}: {name} has {column_lengths[i]} values but input_ids has {lengths[i]} tokens; every "
                f"per-token column must have one value per token (or name {name!r} in keep_columns to keep it "
                "per example)."
            )
    return lengths


def check_non_negative_ids(column: pa.ChunkedArray, *, first_index: int = 0) -> None:
    """Refuse a negative token id in an ``input_ids`` list column, naming the example, position and value.

    Cost: one vectorised ``min`` over the values (and, only once one is negative, a search for it).

    >>> check_non_negative_ids(pa.chunked_array([[[5, 6], [7, -100, 8]]]))
    Traceback (most recent call last):
    ...
    ValueError: Example 1: input_ids[1] = -100 is negative; token ids are 0 or more (an embedding row). A -100 belongs in labels, not input_ids: tokenize again or fix this column.
    """
    if pa.types.is_unsigned_integer(column.type.value_type):
        return
    start = first_index
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy().astype(np.int64)
        values = chunk.values.slice(offsets[0], offsets[-1] - offsets[0])
        smallest = pc.min(values).as_py() if len(values) else None
        if smallest is not None and smallest < 0:
            token = int(np.argmax(values.to_numpy(zero_copy_only=False) < 0)) + offsets[0]
            example = int(np.searchsorted(offsets, token, side="right")) - 1
            raise negative_id_error(start + example, int(token - offsets[example]), values[int(token - offsets[0])].as_py())
        start += len(chunk)


def negative_id_error(example: int, position: int, value: int) -> ValueError:
    """The error for a negative token id: where it is, and the fix."""
    return ValueError(
        f"Example {example}: input_ids[{position}] = {value} is negative; token ids are 0 or more (an embedding "
        "row). A -100 belongs in labels, not input_ids: tokenize again or fix this column."
    )


def _zero_owners(column: pa.ChunkedArray) -> np.ndarray:
    """int64, one entry per zero value in ``column``'s lists: the index of the example (list) holding it, ascending."""
    owners, start = [], 0
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy().astype(np.int64)  # this chunk's (maybe sliced) lists, into chunk.values
        values = chunk.values.slice(offsets[0], offsets[-1] - offsets[0])
        zero = pc.fill_null(pc.equal(values, pa.scalar(0).cast(values.type)), False)
        if pc.any(zero).as_py():
            tokens = np.flatnonzero(zero.to_numpy(zero_copy_only=False)) + offsets[0]
            examples = np.searchsorted(offsets, tokens, side="right") - 1
            if chunk.null_count:  # a null list may hide values; it has no mask, so no zeros
                examples = examples[~chunk.is_null().to_numpy(zero_copy_only=False)[examples]]
            owners.append(examples + start)
        start += len(chunk)
    return np.concatenate(owners) if owners else np.empty(0, np.int64)


def table_zero_owners(table: pa.Table) -> np.ndarray:
    """int64, one entry per ``attention_mask`` zero: the example holding it (ascending); none without a per-token mask."""
    if "attention_mask" not in table.column_names or not is_per_token(table.schema.field("attention_mask").type):
        return np.empty(0, np.int64)
    return _zero_owners(table.column("attention_mask"))


def read_examples(
    table: pa.Table,
    columns: ExampleColumns | Sequence[str] = (),
    *,
    first_index: int = 0,
    stream: bool = False,
    check_padding: bool = True,
) -> tuple[ExampleColumns, np.ndarray]:
    """The packable columns and int64 (n,) tokens per example of ``table``, every check run: the one reading of a table.

    ``columns`` is an :class:`ExampleColumns` already classified, or the ``keep_columns``
    to classify by (:func:`example_columns`); the lengths come from :func:`token_lengths`
    and a padded example is refused (:func:`~packing_collators._validation.check_unpadded`;
    ``check_padding=False`` for a table whose examples were checked already). Errors number
    the examples from ``first_index``; with ``stream``, counts are of the examples read so far.

    >>> table = pa.table({"input_ids": [[5, 6], [7, 8, 0], [9, 0, 0]], "attention_mask": [[1, 1], [1, 1, 0], [1, 0, 0]]})
    >>> read_examples(table.drop_columns("attention_mask"))[1].tolist()
    [2, 3, 3]
    >>> read_examples(table)
    Traceback (most recent call last):
    ...
    ValueError: Example 1 is padded: its attention_mask has 1 zero(s) (2 of 3 examples have attention_mask zeros). Example 1 has attention_mask zeros inside it, so packing would put its pad tokens into rows and train on them. Tokenize with padding=False, or strip the padding first (keep the tokens where attention_mask is 1).
    """
    if not isinstance(columns, ExampleColumns):
        columns = example_columns(table.schema, columns)
    lengths = token_lengths(table, columns, first_index=first_index)
    if check_padding:
        check_unpadded(table_zero_owners(table), table.num_rows, first_index=first_index, stream=stream)
    return columns, lengths
