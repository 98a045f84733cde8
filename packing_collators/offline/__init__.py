"""Offline pre-packing: a whole ``datasets`` dataset (or a stream) packed into rows, once.

    _options.py       PackOptions and CacheOptions, pack_dataset's options validated once
    _columns.py       which columns are per-token (packed), kept, or refused
    _row_plan.py      the plan: which example's tokens (from which offset) go to which row, in which order
    _planning.py      lengths + options -> the global plan (split pieces, shuffle, this machine's shard)
    _arrow_rows.py    building the rows as Arrow columns from the plan (no loop over tokens)
    _arrow_files.py   a Dataset's own Arrow files, memory-mapped here and released window by window
    _disk_rows.py     the rows written to a file once (two passes for an input larger than memory)
    _cache_files.py   cache files named by fingerprint (as Dataset.map's), the stats beside them, reuse
    _partial_files.py half-written files locked by their writer; a dead writer's removed by the next build
    _pack_dataset.py  pack_dataset for a Dataset / DatasetDict, and pack_table
    _streaming.py     pack_dataset for an IterableDataset or any stream, buffer by buffer:
    _stream_source.py   the stream read as Arrow tables, rows given back as dicts
    _stream_bins.py     bfd / ffd / next_fit: each buffer packed, the emptiest rows' examples carried
    _stream_wrapped.py  wrapped: each buffer cut into full rows, the unfinished row carried (resumable)

Built on the engine (lengths -> rows) and collate (segment layout); the statistics are the
engine's PackStats.
"""

from ._columns import RESERVED_COLUMNS, ExampleColumns, example_columns, is_per_token, read_examples, token_lengths
from ._options import MAX_LENGTH_FIX, SPLIT_FIX, DatasetStrategy, PackOptions
from ._pack_dataset import pack_dataset, pack_table

__all__ = [
    "DatasetStrategy",
    "ExampleColumns",
    "MAX_LENGTH_FIX",
    "PackOptions",
    "RESERVED_COLUMNS",
    "SPLIT_FIX",
    "example_columns",
    "is_per_token",
    "pack_dataset",
    "pack_table",
    "read_examples",
    "token_lengths",
]
