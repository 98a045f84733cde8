"""The packed batch's keys, named once: what the collators write and every reader takes from it.

A flat row of three examples (``B = 1`` row, ``T = 9`` tokens, ``n = 3`` examples)::

    input_ids      int64 (B, T)    [[   a, b, c,    d, e,    f, g, h, i]]
    labels         int64 (B, T)    [[-100, b, c, -100, e, -100, g, h, i]]   -100 (IGNORE_INDEX): no target
    position_ids   int64 (B, T)    [[   0, 1, 2,    0, 1,    0, 1, 2, 3]]   a restart: a new example
    cu_seq_lens_q  int32 (n + 1,)  [0, 3, 5, 9]       } VarlenKwargs: what a varlen kernel reads, as
    cu_seq_lens_k  int32 (n + 1,)  [0, 3, 5, 9]       } transformers names them (FlashAttentionKwargs);
    max_length_q   int             4                  } the key side equals the query side unless a
    max_length_k   int             4                  } batch lays its keys out apart (below)
    seq_idx        int32 (B, T)    [[0, 0, 0, 1, 1, 2, 2, 2, 2]]            asked for: Mamba-style kernels
    shift_labels   int64 (B, T)    a sequence shard's targets, fixed before the cut (``parallel/``)
    kv_index       int64 (Tk,)     keys laid out apart from the queries: each key's row token (a shared prompt)
    q_index        int64 (T,)      and each row token's key position (``KeysApartBatch``)
    keys_labels    int64 (1, Tk)   the labels over the keys' layout (a shared prompt's: ``_shared_prompt.py``)
    token_sequence int64 (1, Tk)   the sequence each token (each key, where keys are apart) belongs to, counted
                                   over the batch: what a per-sequence loss (DPO, GRPO) sums by
    use_cache      bool            False: no KV cache in training

The names are string constants here and nowhere else in the package: every module that writes or
reads a key goes through them (``tests/test_structure.py`` keeps it so). The four varlen keys are
written by :func:`varlen_kwargs` from a :class:`SegmentLayout` of the queries and, where the keys
and values are laid out apart from the queries, one of their own: a preference pair's prompt, laid
out once for the queries and once per completion for the keys (``cu_seq_lens_q != cu_seq_lens_k``),
extends :class:`PackedBatch` with its keys and writes ``varlen_kwargs(queries, keys)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

__all__ = [
    "CU_SEQ_LENS_K",
    "CU_SEQ_LENS_Q",
    "IGNORE_INDEX",
    "KEYS_LABELS",
    "KV_INDEX",
    "MAX_LENGTH_K",
    "MAX_LENGTH_Q",
    "PACKING_KEYS",
    "Q_INDEX",
    "SEQ_IDX",
    "SHIFT_LABELS",
    "SEQUENCE_KEYS",
    "TARGET_KEYS",
    "TOKEN_SEQUENCE",
    "VARLEN_KEYS",
    "KeysApartBatch",
    "PackedBatch",
    "VarlenKwargs",
    "varlen_kwargs",
    "varlen_values",
]

CU_SEQ_LENS_Q, CU_SEQ_LENS_K = "cu_seq_lens_q", "cu_seq_lens_k"
MAX_LENGTH_Q, MAX_LENGTH_K = "max_length_q", "max_length_k"
VARLEN_KEYS = (CU_SEQ_LENS_Q, CU_SEQ_LENS_K, MAX_LENGTH_Q, MAX_LENGTH_K)
SEQ_IDX = "seq_idx"
PACKING_KEYS = (*VARLEN_KEYS, SEQ_IDX)  # the layout a collator writes: no example brings its own
SHIFT_LABELS = "shift_labels"
KV_INDEX, Q_INDEX = "kv_index", "q_index"  # a layout whose keys are laid out apart from its queries
TARGET_KEYS = ("labels", SHIFT_LABELS)  # what the loss reads, never the model's input
KEYS_LABELS, TOKEN_SEQUENCE = "keys_labels", "token_sequence"  # a per-sequence loss's bookkeeping
SEQUENCE_KEYS = (KEYS_LABELS, TOKEN_SEQUENCE)  # never the model's input
IGNORE_INDEX = -100  # a label that is no target


class VarlenKwargs(TypedDict, total=False):
    """The four keys a varlen attention kernel reads (transformers' ``FlashAttentionKwargs``).

    >>> tuple(VarlenKwargs.__annotations__) == VARLEN_KEYS
    True
    """

    cu_seq_lens_q: Any  # int32 (n + 1,): where each query sequence starts, then the total
    cu_seq_lens_k: Any  # int32 (m + 1,): the same for the keys and values
    max_length_q: int
    max_length_k: int


class PackedBatch(VarlenKwargs, total=False):
    """A collated packed batch: the varlen keys and the rest, each with its dtype and shape (module docstring).

    A batch whose keys are laid out apart from its queries (completions sharing a prompt) subclasses it:
    :class:`KeysApartBatch`.
    """

    input_ids: Any  # int64 (B, T)
    labels: Any  # int64 (B, T), IGNORE_INDEX where a token is no target
    position_ids: Any  # int64 (B, T), restarting at every example
    seq_idx: Any  # int32 (B, T), the example of each token (asked for)
    shift_labels: Any  # int64 (B, T): what each position predicts (a sequence shard's)


class KeysApartBatch(PackedBatch, total=False):
    """A packed batch whose keys and values are laid out apart from its queries (``cu_seq_lens_k`` over ``Tk``
    keys): a prompt once among the queries and once per completion among the keys (``SharedPromptLayout``: a
    DPO pair's two completions, a GRPO group's G)."""

    kv_index: Any  # int64 (Tk,): the row token each key is
    q_index: Any  # int64 (T,): each row token's key position
    keys_labels: Any  # int64 (1, Tk): the labels over the keys' layout
    token_sequence: Any  # int64 (1, Tk): each key's sequence
    use_cache: bool


def varlen_kwargs(queries, keys=None) -> VarlenKwargs:
    """The varlen keys of queries laid out as ``queries`` (a :class:`SegmentLayout`), keys and values as
    ``keys`` (default: the same layout).

    >>> from packing_collators.batch import segment_layout
    >>> varlen_kwargs(segment_layout([3, 2]))
    {'cu_seq_lens_q': array([0, 3, 5], dtype=int32), 'cu_seq_lens_k': array([0, 3, 5], dtype=int32), 'max_length_q': 3, 'max_length_k': 3}
    >>> varlen_kwargs(segment_layout([3, 2]), segment_layout([5, 5]))[CU_SEQ_LENS_K].tolist()
    [0, 5, 10]
    """
    keys = queries if keys is None else keys
    return {
        CU_SEQ_LENS_Q: queries.cu_seq_lens,
        CU_SEQ_LENS_K: keys.cu_seq_lens,
        MAX_LENGTH_Q: queries.max_length,
        MAX_LENGTH_K: keys.max_length,
    }


def varlen_values(kwargs: Mapping[str, Any]) -> tuple:
    """``(cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)`` of a batch or an attention call (None where absent).

    >>> varlen_values({"cu_seq_lens_q": [0, 3], "max_length_q": 3})
    ([0, 3], None, 3, None)
    """
    return tuple(kwargs.get(key) for key in VARLEN_KEYS)
