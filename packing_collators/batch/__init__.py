"""The packed batch: its keys, its layout, and the one rule that reads its examples back.

    _keys.py        PackedBatch / VarlenKwargs: every key with its dtype and shape; the key names, written
                    as strings here only; varlen_kwargs writes the four varlen keys, varlen_values reads them
    _layout.py      SegmentLayout: segment lengths -> cu_seq_lens, max_length, position_ids, seq_idx (numpy),
                    and the torch view a model's call takes
    _boundaries.py  where a batch's examples start: cu_seq_lens_q of one row, else restarting position_ids,
                    else one per row (segment_starts, segment_ids, segment_count, read_layout)
    _targets.py     what each position predicts: shift_labels, else labels shifted by one

Who writes and who reads::

    collate/, parallel/  --segment_layout, varlen_kwargs-->  the batch  --segment_starts, read_layout-->  checks/, models/,
                                                                         --varlen_values-->              attention/,
                                                                         --segment_ids, segment_count--> trainer/ (loss, metrics)
                                                                         --shifted_targets-->            loss/, trainer/

A batch of another kind extends it here rather than restating it: a preference batch (a prompt shared
by a chosen and a rejected completion) subclasses ``PackedBatch`` with its keys and a layout with its
segments' roles, and writes its keys' own layout with ``varlen_kwargs(queries, keys)``.
numpy only on import; torch is imported by the readers that return tensors.
"""

from ._boundaries import batch_shape, padding_tail, read_layout, segment_count, segment_ids, segment_starts
from ._keys import (
    CU_SEQ_LENS_K,
    CU_SEQ_LENS_Q,
    IGNORE_INDEX,
    KV_INDEX,
    MAX_LENGTH_K,
    MAX_LENGTH_Q,
    PACKING_KEYS,
    Q_INDEX,
    SEQ_IDX,
    SHIFT_LABELS,
    TARGET_KEYS,
    VARLEN_KEYS,
    KeysApartBatch,
    PackedBatch,
    VarlenKwargs,
    varlen_kwargs,
    varlen_values,
)
from ._layout import SegmentLayout, segment_layout
from ._targets import shifted_targets, target_count

__all__ = [
    "CU_SEQ_LENS_K",
    "CU_SEQ_LENS_Q",
    "IGNORE_INDEX",
    "KV_INDEX",
    "KeysApartBatch",
    "MAX_LENGTH_K",
    "MAX_LENGTH_Q",
    "PACKING_KEYS",
    "Q_INDEX",
    "SEQ_IDX",
    "SHIFT_LABELS",
    "TARGET_KEYS",
    "VARLEN_KEYS",
    "PackedBatch",
    "SegmentLayout",
    "VarlenKwargs",
    "batch_shape",
    "padding_tail",
    "read_layout",
    "segment_count",
    "segment_ids",
    "segment_layout",
    "segment_starts",
    "shifted_targets",
    "target_count",
    "varlen_kwargs",
    "varlen_values",
]
