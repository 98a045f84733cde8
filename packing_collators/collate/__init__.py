"""Collating: examples (or pre-packed rows) into the batches a model trains on.

    _concat.py        token lists, arrays or tensors concatenated into one int64 array
    _segments.py      segment lengths -> position_ids, cu_seq_lens, seq_idx; into_rows: tokens into padded rows
    _features.py      reading and checking every key of every example (per-token keys carried, others refused)
    _flat_row.py      one flat row from tokens and segments (padding a segment of its own)
    _buckets.py       length buckets: rows padded to a few total lengths (torch.compile shapes)
    _options.py       CollateOptions (FlatteningCollator's, shared) and PrePackedOptions: frozen, checked when built
    _flattening.py    FlatteningCollator: a minibatch -> one flat row (online flattening)
    _prepacked.py     PrePackedCollator: rows of pack_dataset -> a flat row or padded rows
    _padded_rows.py   pack_sequences / concatenate_and_pack: token lists -> padded packed tensors

Built on the engine; torch is imported only to return tensors.
"""

from ._buckets import bucket_length, bucket_padding_fraction, length_buckets, validate_buckets
from ._concat import concat_tokens, sequence_lengths
from ._features import (
    TokenFeatures,
    check_same_lengths,
    check_unpadded,
    feature_column,
    read_token_features,
    to_tensors,
)
from ._flat_row import flat_batch, pad_to_multiple
from ._flattening import FlatteningCollator
from ._options import CollateOptions, ReturnTensors
from ._padded_rows import concatenate_and_pack, pack_sequences
from ._prepacked import PrePackedCollator
from ._segments import SegmentLayout, segment_layout

__all__ = [
    "CollateOptions",
    "FlatteningCollator",
    "PrePackedCollator",
    "ReturnTensors",
    "SegmentLayout",
    "TokenFeatures",
    "bucket_length",
    "bucket_padding_fraction",
    "check_same_lengths",
    "check_unpadded",
    "concat_tokens",
    "concatenate_and_pack",
    "feature_column",
    "flat_batch",
    "length_buckets",
    "pack_sequences",
    "pad_to_multiple",
    "read_token_features",
    "segment_layout",
    "sequence_lengths",
    "to_tensors",
    "validate_buckets",
]
