"""Collating: examples (or pre-packed rows) into the batches a model trains on.

    _features.py      a batch's columns: every key of every example read and checked for shape
                      (per-token keys carried, others refused), the examples' lengths
    _concat.py        the columns' values laid end to end as int64, every value checked (token_features)
    _flat_row.py      one flat row from those tokens and their SegmentLayout (padding a segment of its own)
    _buckets.py       length buckets: rows padded to a few total lengths (torch.compile shapes)
    _bucketed.py      a collator padding every row to one bucket, for compiled training
    _options.py       CollateOptions (FlatteningCollator's, shared) and PrePackedOptions: frozen, checked when built
    _flattening.py    FlatteningCollator: a minibatch -> one flat row (online flattening)
    _prepacked.py     PrePackedCollator: rows of pack_dataset -> a flat row or padded rows
    _padded_rows.py   pack_sequences / concatenate_and_pack: token lists -> padded packed tensors
    _shared_prompt.py shared_prompt_batch: completions of one prompt, the prompt once (DPO's pairs, GRPO's
                      groups); flat_sequences_batch: the same sequences unshared, each token's sequence named

One batch runs the line ``_features -> _concat -> _options -> _flat_row``; the keys it writes and
their layout are the packed batch's (``packing_collators.batch``). Built on the engine and the
batch; torch is imported only to return tensors.
"""

from ._bucketed import bucket_padding_id, bucketed_collator, compile_buckets, plan_padding
from ._buckets import bucket_length, bucket_padding_fraction, length_buckets, validate_buckets
from ._concat import TokenFeatures, concat_tokens, token_features
from ._features import Columns, check_same_lengths, feature_column, read_columns, sequence_lengths
from ._flat_row import flat_batch
from ._flattening import FlatteningCollator
from ._options import CollateOptions, ReturnTensors, to_tensors
from ._padded_rows import concatenate_and_pack, pack_sequences
from ._prepacked import PrePackedCollator
from ._shared_prompt import flat_sequences_batch, shared_prompt_batch

__all__ = [
    "CollateOptions",
    "Columns",
    "FlatteningCollator",
    "PrePackedCollator",
    "ReturnTensors",
    "TokenFeatures",
    "bucket_length",
    "bucket_padding_fraction",
    "bucket_padding_id",
    "bucketed_collator",
    "check_same_lengths",
    "compile_buckets",
    "concat_tokens",
    "concatenate_and_pack",
    "feature_column",
    "flat_batch",
    "flat_sequences_batch",
    "length_buckets",
    "pack_sequences",
    "plan_padding",
    "read_columns",
    "sequence_lengths",
    "shared_prompt_batch",
    "to_tensors",
    "token_features",
    "validate_buckets",
]
