"""Offline packing of a whole dataset into rows of ``max_length`` tokens, once, before training.

Four examples packed into rows of 8 (best-fit decreasing over the *whole* dataset)::

    example lengths   5  2  4  3
    row 0   input_ids     S0 S0 S0 S0 S0 S3 S3 S3     seq_lengths [5, 3]
            position_ids   0  1  2  3  4  0  1  2
    row 1   input_ids     S1 S1 S2 S2 S2 S2           seq_lengths [2, 4]
            position_ids   0  1  0  1  2  3

Packing is global (TRL packs inside each 1,000-example ``map`` batch, so every
batch leaves a half-empty row behind), then the rows are shuffled (seeded),
because decreasing-size strategies leave row ``i`` correlated with length.
The plan comes from the lengths alone (``_planning``), so a sharded build computes it on every
machine and builds its own range of rows. A ``Dataset`` backed by cache files is packed into
cache files beside them (``_cache_files``: read through our own memory map, each row written
once, reused by a second identical call); any other is packed in memory.
Cost: the engine's one sort over lengths, then a memcpy per segment per column and a cumsum
for ``position_ids``; no Python loop over examples or tokens. Time and memory at 1M and 3M
examples against TRL's ``pack_dataset``: ``benchmarks/results/pack_at_scale_3m.md`` (linked from
docs/benchmarks.md; ``benchmarks/cpu/bench_offline.py at-scale``).
The result is in the input's format (``with_format``), streams included.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from .._compat import format_columns
from .._progress import show_progress
from .._splits import per_split
from ..engine import Overflow, PackStats
from ._arrow_rows import CHUNK_TOKENS, build_rows
from ._cache_files import pack_to_cache, packed_fingerprint
from ._columns import RESERVED_COLUMNS, read_examples
from ._empty import typed_empty, warn_if_nothing_packed
from ._options import CacheOptions, DatasetStrategy, PackOptions
from ._planning import plan_rows

__all__ = ["pack_dataset", "pack_table"]

logger = logging.getLogger(__name__)


def _show_progress(options: PackOptions, total_tokens: int) -> bool:
    """The library's one rule (``_progress``): a bar for 64M+ tokens unless datasets or transformers has bars off."""
    return show_progress(options.progress, total_tokens, threshold=4 * CHUNK_TOKENS)


def pack_table(table, options: PackOptions, *, desc: str = "Packing rows"):
    """``(rows, stats)``: a ``pyarrow.Table`` of examples packed into a table of rows.

    >>> import pyarrow as pa
    >>> table = pa.table({"input_ids": [[1, 2, 3], [4, 5], [6]]})
    >>> rows, stats = pack_table(table, PackOptions(max_length=4, shuffle_rows=False))
    >>> rows.to_pylist()
    [{'input_ids': [1, 2, 3, 6], 'position_ids': [0, 1, 2, 0], 'seq_lengths': [3, 1]}, {'input_ids': [4, 5], 'position_ids': [0, 1], 'seq_lengths': [2]}]
    """
    columns, lengths = read_examples(table, options.keep_columns)
    plan, stats = plan_rows(lengths, options)
    rows = build_rows(
        table,
        plan,
        columns,
        lengths,
        label_pad_id=options.label_pad_id,
        num_proc=options.num_proc,
        progress=_show_progress(options, plan.total_tokens),
        desc=desc,
    )
    return rows, stats


def _log(stats: PackStats, name: str) -> None:
    lost = stats.truncated_examples + stats.dropped_examples + stats.empty_examples
    logger.log(logging.WARNING if lost else logging.INFO, "pack_dataset%s: %s", name, stats.summary())
    warn_if_nothing_packed(stats, name)


def _pack_in_memory(dataset, options: PackOptions, split_name: str = ""):
    from datasets import Dataset
    from datasets.table import InMemoryTable

    table = typed_empty(dataset.with_format("arrow")[:] if len(dataset) else dataset.data.table.slice(0, 0))
    rows, stats = pack_table(table, options, desc=f"Packing {split_name or 'rows'}")
    _log(stats, f"[{split_name}]" if split_name else "")
    packed = Dataset(InMemoryTable(rows), split=dataset.split, fingerprint=packed_fingerprint(dataset, options))
    return _with_format_of(dataset, packed), stats


def _pack_split(dataset, options: PackOptions, cache: CacheOptions, split_name: str = ""):
    """One ``Dataset``: in memory (``keep_in_memory``, or no cache files and no ``cache_file_name``), else on disk."""
    path = cache.path_of(split_name)
    if cache.keep_in_memory or (not dataset.cache_files and path is None):
        return _pack_in_memory(dataset, options, split_name)
    packed, stats, _ = pack_to_cache(
        dataset,
        options,
        path=path,
        load_from_cache_file=cache.load_from_cache_file,
        progress=lambda tokens: _show_progress(options, tokens),
        desc=f"Packing {split_name or 'rows'}",
    )
    _log(stats, f"[{split_name}]" if split_name else "")
    return _with_format_of(dataset, packed), stats


def _with_format_of(dataset, packed):
    """``packed`` in ``dataset``'s format (type, columns, output_all_columns, format kwargs), as TRL keeps it.

    Chosen columns that are gone are left out; ``position_ids`` and ``seq_lengths`` are added
    to them, since a row without them has lost its example boundaries.
    """
    # None means every column; dataset.format lists the current ones instead, which would leave new ones out
    columns = format_columns(dataset)
    if columns is not None:
        columns = [name for name in columns if name in packed.column_names]
        columns += [name for name in RESERVED_COLUMNS if name not in columns]
    packed.set_format(
        dataset.format["type"], columns, dataset.format["output_all_columns"], **dataset.format["format_kwargs"]
    )
    return packed


def pack_dataset(
    dataset: Any,
    max_length: int,
    *,
    strategy: DatasetStrategy = "bfd",
    overflow: Overflow = "error",
    shuffle_rows: bool = True,
    seed: int = 0,
    keep_columns: Sequence[str] = (),
    label_pad_id: int = -100,
    num_proc: int | None = None,
    buffer_size: int = 10_000,
    progress: bool | None = None,
    return_stats: bool = False,
    cache_file_name: str | dict[str, str] | None = None,
    keep_in_memory: bool = False,
    load_from_cache_file: bool | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
):
    """Pack a tokenized dataset into rows of at most ``max_length`` tokens.

    Args:
        dataset: a ``datasets.Dataset`` or ``DatasetDict`` (packed globally: one plan over every
            example's length), or a ``datasets.IterableDataset``, ``IterableDatasetDict`` or plain
            iterator of example dicts (packed on the fly with a buffer of ``buffer_size`` examples).
            A ``Dataset`` backed by cache files (``load_from_disk``, ``map``) is packed into Arrow
            cache files beside them, in memory bounded by a chunk of rows plus O(examples), and
            comes back memory-mapped; one without cache files is packed in memory.
        max_length: tokens per row.
        strategy: ``"bfd"`` (best-fit decreasing, default, tightest), ``"ffd"``, ``"next_fit"``
            (keeps dataset order), or ``"wrapped"``: examples concatenated (in shuffled order when
            ``shuffle_rows``) and cut into full rows, splitting examples across rows; every token
            is kept, boundaries are not. Each fragment is a segment of its own: its ``position_ids``
            restart at 0 and it has its own entry in ``seq_lengths``. Only the first token of an
            *example* gets label ``label_pad_id``; a row that starts mid-example keeps its first
            label (a causal LM never uses a row's first label; :class:`PrePackedCollator` masks it
            in flattened batches). The last row may be shorter. Streams too (one buffer in memory).
        overflow: an example longer than ``max_length``: ``"error"`` (default), ``"truncate"``
            (its first ``max_length`` tokens, in a row of its own), ``"drop"``, or ``"split"``: cut
            into pieces of ``max_length`` tokens (the last shorter), each packed as an example of
            its own (``position_ids`` restart, first label ``label_pad_id``), every token kept;
            counted in the stats (``split_examples``). ``"wrapped"`` never overflows. Not
            ``"split"`` when streaming with a bin strategy.
        shuffle_rows: shuffle the packed rows (seeded by ``seed``); ``False`` keeps packing order.
        keep_columns: per-example columns (e.g. ``["source"]``) kept as one list per row, one
            value per segment. Any other column that is not per-token is an error.
        label_pad_id: label of each example's first token.
        num_proc: processes writing the rows to cache files (each writes a contiguous range of
            rows, one file each; together they are one dataset), or threads building the rows
            in memory (chunks of about 16M tokens).
        buffer_size: examples per streaming buffer (larger packs tighter, costs memory).
        progress: show a progress bar; ``None`` shows one for long work (64M+ tokens).
        return_stats: also return a :class:`PackStats` (a dict of them for a ``DatasetDict``).
        cache_file_name: where to write the packed rows of a ``Dataset`` (a dict of split name to
            path for a ``DatasetDict``); default: ``cache-<fingerprint>.arrow`` beside the
            dataset's own cache files, as ``Dataset.map`` names them. The statistics go beside it
            (``cache-<fingerprint>.json``).
        keep_in_memory: pack a ``Dataset`` in memory even if it has cache files.
        load_from_cache_file: reuse the rows (and statistics) of an earlier call on the same input
            (fingerprint) with the same options instead of packing again; default: whether
            ``datasets`` caching is on, as in ``Dataset.map``.
        num_shards, shard_index: build only shard ``shard_index`` of ``num_shards``: rows
            ``[i * R // N, (i + 1) * R // N)`` of the ``R`` rows of the whole packing, in its final
            (shuffled) order. Every machine computes the same plan from the lengths, so the
            shards, concatenated in order, are the one-machine result row for row; the statistics
            are the whole packing's. Not for streams.

    Every packed row holds (``t`` = tokens in the row, ``s`` = segments in the row):
        ``input_ids`` (t,) in the dataset's dtype; ``labels`` (t,) if the dataset has labels, each
        example's first token ``label_pad_id``; ``position_ids`` int32 (t,), restarting at 0 per
        segment; ``seq_lengths`` int32 (s,); every other per-token column (e.g.
        ``attention_mask``) concatenated the same way; each kept column as a list of (s,) values.
        Zero-length examples are in no row (counted as ``empty_examples``). Nothing to pack (no
        examples, or only empty ones) gives an empty result and a ``UserWarning``, not an error.

    Examples must not be padded: an ``attention_mask`` with zeros is a ValueError naming the first
    padded example; a negative ``input_ids`` value is a ValueError naming the example, position
    and value. A ``Dataset`` (each split of a ``DatasetDict``) comes back in its format: the
    same type, format kwargs and ``output_all_columns``, and chosen columns plus ``position_ids``
    and ``seq_lengths``; an ``IterableDataset`` keeps its format type (``with_format("numpy")``).

    >>> from datasets import Dataset
    >>> data = Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12, 13, 14]],
    ...                           "labels": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12, 13, 14]]})
    >>> packed, stats = pack_dataset(data, max_length=8, shuffle_rows=False, return_stats=True)
    >>> packed[0]
    {'input_ids': [1, 2, 3, 4, 5, 12, 13, 14], 'labels': [-100, 2, 3, 4, 5, -100, 13, 14], 'position_ids': [0, 1, 2, 3, 4, 0, 1, 2], 'seq_lengths': [5, 3]}
    >>> packed[:]["seq_lengths"], stats.rows, stats.efficiency
    ([[5, 3], [2, 4]], 2, 0.875)
    >>> pack_dataset(data.with_format("numpy"), max_length=8).format["type"]
    'numpy'
    >>> pack_dataset(data, max_length=4)
    Traceback (most recent call last):
    ...
    ValueError: Example 0 has 5 tokens, more than max_length=4 (1 example(s) too long, the longest 5 tokens). Pass overflow='split' (keep every token, in pieces), overflow='truncate' or overflow='drop', or raise max_length.
    >>> pack_dataset(data, max_length=4, overflow="split", shuffle_rows=False)[:]["seq_lengths"]
    [[4], [4], [1, 3], [2]]
    """
    import datasets

    options = PackOptions(
        max_length=max_length, strategy=strategy, overflow=overflow, shuffle_rows=shuffle_rows, seed=seed,
        keep_columns=tuple(keep_columns), label_pad_id=label_pad_id, num_proc=num_proc, buffer_size=buffer_size,
        progress=progress, num_shards=num_shards, shard_index=shard_index
    )  # fmt: skip
    reuse = datasets.is_caching_enabled() if load_from_cache_file is None else load_from_cache_file
    cache = CacheOptions(cache_file_name, keep_in_memory, reuse)
    if isinstance(dataset, datasets.Dataset):
        packed, stats = _pack_split(dataset, options, cache)
    elif isinstance(dataset, datasets.DatasetDict):
        cache.check_splits(dataset)
        pack_one = lambda split, name: _pack_split(split, options, cache, name)  # noqa: E731
        packed, stats = per_split(dataset, pack_one, datasets.DatasetDict)
    elif isinstance(dataset, (datasets.IterableDataset, datasets.IterableDatasetDict)) or _is_example_iterator(dataset):
        from ._streaming import pack_streaming

        _check_stream_options(options, cache)
        packed, stats = pack_streaming(dataset, options)
    else:
        raise TypeError(
            "pack_dataset takes a datasets.Dataset, DatasetDict, IterableDataset, IterableDatasetDict or an "
            f"iterator of example dicts, got {type(dataset).__name__}."
        )
    return (packed, stats) if return_stats else packed


def _check_stream_options(options: PackOptions, cache: CacheOptions) -> None:
    """Refuse what only a whole ``Dataset`` can do: split pieces, shards, cache files."""
    if options.overflow == "split" and options.strategy != "wrapped":  # wrapped never overflows
        raise ValueError(
            "overflow='split' is not supported when streaming (an example's pieces are packed with the whole "
            "dataset's lengths); pass overflow='truncate' or overflow='drop', strategy='wrapped' (every token "
            "kept, cut at row ends), or pack a datasets.Dataset."
        )
    if options.num_shards > 1:
        raise ValueError(
            "num_shards/shard_index are not supported when streaming (each shard is a range of the whole "
            "dataset's rows); shard the stream itself (IterableDataset.shard) and pack each part."
        )
    if cache.chosen:
        raise ValueError(
            "cache_file_name and keep_in_memory are for a datasets.Dataset; a stream is packed as it is read."
        )


def _is_example_iterator(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict, list, tuple))
