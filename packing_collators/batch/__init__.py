"""The packed batch: its keys, its layout, and the one rule that reads its examples back.

    _keys.py        PackedBatch / VarlenKwargs: every key with its dtype and shape; the key names, written
                    as strings here only; varlen_kwargs writes the four varlen keys, varlen_values reads them
    _layout.py      SegmentLayout: segment lengths -> cu_seq_lens, max_length, position_ids, seq_idx (numpy),
                    and the torch view a model's call takes
    _boundaries.py  where a batch's examples start: cu_seq_lens_q of one row, else restarting position_ids,
                    else one per row (segment_starts, segment_ids, segment_count, read_layout)
    _targets.py     what each position predicts: shift_labels, else labels shifted by one
    _shared_prompt.py  SharedPromptLayout: N completions of one prompt, the prompt once among the queries and
                    once per completion among the keys (DPO's pairs, GRPO's groups)

Who writes and who reads::

    collate/, parallel/  --segment_layout, varlen_kwargs-->  the batch  --segment_starts, read_layout-->  checks/, models/,
                                                                         --varlen_values-->              attention/,
                                                                         --segment_ids, segment_count--> trainer/ (loss, metrics)
                                                                         --shifted_targets-->            loss/, trainer/

A batch of another kind extends it here rather than restating it: completions sharing a prompt
(``KeysApartBatch``) add their keys' layout (``SharedPromptLayout``) and write it with
``varlen_kwargs(queries, keys)``.
numpy only on import; torch is imported by the readers that return tensors.
"""

from . import _boundaries, _keys, _layout, _shared_prompt, _targets
from ._boundaries import *  # noqa: F403 (each module's __all__ is the folder's, once)
from ._keys import *  # noqa: F403
from ._layout import *  # noqa: F403
from ._shared_prompt import *  # noqa: F403
from ._targets import *  # noqa: F403

__all__ = sorted([*_boundaries.__all__, *_keys.__all__, *_layout.__all__, *_shared_prompt.__all__, *_targets.__all__])  # noqa: PLE0605
