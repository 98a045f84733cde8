"""Cut one collated flat row into ``size`` contiguous sequence shards, targets fixed before the cut.

A row of two examples (5 and 2 tokens) for ``size=2`` ranks; the row is padded to a multiple of
2 with a segment of its own, and every target is computed over the whole row first::

    input_ids     = [[ a  b  c  d  e | f  g | 0 ]]      T = 8 (7 + 1 padding token)
    position_ids  = [[ 0  1  2  3  4 | 0  1 | 0 ]]      global: each example counts from 0
    shift_labels  = [[ b  c  d  e -100 g -100 -100]]    the next token; -100 at every example end
    cu_seq_lens   = [0, 5, 7, 8]                        global, on every rank
    rank 0 keeps tokens 0..3, rank 1 tokens 4..7:
    rank 0: input_ids [[a b c d]]  shift_labels [[b c d e]]
    rank 1: input_ids [[e f g 0]]  shift_labels [[-100 g -100 -100]]

The target of ``d`` (``e``) lives on rank 1's side of the cut but is kept on rank 0, so no target is
lost at a shard edge and none crosses an example boundary; the shards' targets are disjoint, so their
counts sum to the row's. ``labels`` is cut too (for callbacks that read it); the loss reads
``shift_labels``. ``cu_seq_lens_q/k`` and ``max_length_q/k`` stay global: the Ulysses attention
(:mod:`._ulysses`) runs the kernel over the whole row.
Cost: a few tensor slices and one pad per micro-batch, no loop over tokens.
"""

from __future__ import annotations

from typing import Any

from ..batch import CU_SEQ_LENS_Q, IGNORE_INDEX, SEQ_IDX, SHIFT_LABELS, read_layout, varlen_kwargs

__all__ = ["SequenceShardCollator", "shard_flat_batch"]

_TOKEN_KEYS = ("input_ids", "labels", "position_ids", SHIFT_LABELS, SEQ_IDX)


def _as_tensor(value):
    import numpy as np
    import torch

    return torch.from_numpy(value) if isinstance(value, np.ndarray) else torch.as_tensor(value)


def _check_flat(batch: dict, size: int, rank: int) -> None:
    if not isinstance(size, int) or size < 1 or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size) and size a positive integer; got rank={rank}, size={size}.")
    missing = [k for k in ("input_ids", "labels", "position_ids", CU_SEQ_LENS_Q) if batch.get(k) is None]
    if missing:
        raise ValueError(
            f"Sequence parallelism cuts a flat packed row, and this batch lacks {missing}. Collate with "
            "FlatteningCollator (or PrePackedCollator(mode='flatten')), which returns them."
        )
    if batch.get("attention_mask") is not None or _as_tensor(batch["input_ids"]).shape[0] != 1:
        raise ValueError(
            "Sequence parallelism needs one flat row without attention_mask (input_ids of shape (1, T)); got "
            f"input_ids of shape {tuple(_as_tensor(batch['input_ids']).shape)}"
            f"{' and an attention_mask' if batch.get('attention_mask') is not None else ''}. "
            "Collate with FlatteningCollator() (return_attention_mask off)."
        )


def _shifted(labels, ends):
    """labels[1:] + [-100], with -100 at the last token of every sequence (``ends``: where each ends): (1, T) int64."""
    import torch

    shift = torch.full_like(labels, IGNORE_INDEX)
    shift[:, :-1] = labels[:, 1:]
    shift[0, torch.as_tensor(ends, dtype=torch.long) - 1] = IGNORE_INDEX
    return shift


def _padded(batch: dict, layout, size: int, pad_token_id: int) -> dict:
    """The row padded to a multiple of ``size`` by a segment of its own (labels -100), its layout rewritten."""
    import torch

    length = batch["input_ids"].shape[1]
    padded = layout.padded_to(-(-length // size) * size)
    pad = padded.total - length
    out = {**batch, **{k: v if isinstance(v, int) else _as_tensor(v) for k, v in varlen_kwargs(padded).items()}}
    if not pad:
        return out
    for key, fill in (("input_ids", pad_token_id), ("labels", IGNORE_INDEX), (SHIFT_LABELS, IGNORE_INDEX)):
        out[key] = torch.cat([out[key], out[key].new_full((1, pad), fill)], dim=1)
    positions = torch.arange(pad, dtype=batch["position_ids"].dtype)[None]
    out["position_ids"] = torch.cat([batch["position_ids"], positions], dim=1)
    if SEQ_IDX in out:
        last = int(out[SEQ_IDX].max())
        out[SEQ_IDX] = torch.cat([out[SEQ_IDX], out[SEQ_IDX].new_full((1, pad), last + 1)], dim=1)
    return out


def shard_flat_batch(batch: dict, *, rank: int, size: int, pad_token_id: int = 0) -> dict[str, Any]:
    """This rank's contiguous shard of a flat packed batch (see the module docstring for the layout).

    Returns ``input_ids``, ``labels``, ``position_ids``, ``shift_labels``: int64 (1, T / size), the
    rank's slice of the row padded to a multiple of ``size``; ``cu_seq_lens_q/k``: int32
    (num_seqs + 1,) and ``max_length_q/k``: int, global (the padding segment included).

    >>> import torch
    >>> row = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 6, 7]]), "labels": torch.tensor([[-100, 2, 3, 4, 5, -100, 7]]),
    ...        "position_ids": torch.tensor([[0, 1, 2, 3, 4, 0, 1]]), "cu_seq_lens_q": torch.tensor([0, 5, 7], dtype=torch.int32),
    ...        "cu_seq_lens_k": torch.tensor([0, 5, 7], dtype=torch.int32), "max_length_q": 5, "max_length_k": 5}
    >>> shard = shard_flat_batch(row, rank=1, size=2)
    >>> shard["input_ids"].tolist(), shard["shift_labels"].tolist(), shard["cu_seq_lens_q"].tolist()
    ([[5, 6, 7, 0]], [[-100, 7, -100, -100]], [0, 5, 7, 8])
    """
    _check_flat(batch, size, rank)
    batch = {k: (_as_tensor(v) if k in _TOKEN_KEYS else v) for k, v in batch.items()}
    layout = read_layout(batch)  # the row's examples, as every reader finds them
    batch[SHIFT_LABELS] = _shifted(batch["labels"], layout.cu_seq_lens[1:])
    batch = _padded(batch, layout, size, pad_token_id)
    width = batch["input_ids"].shape[1] // size
    cut = slice(rank * width, (rank + 1) * width)
    return {k: (v[:, cut].contiguous() if k in _TOKEN_KEYS else v) for k, v in batch.items()}


class SequenceShardCollator:
    """Collate with ``collator``, then keep this rank's sequence shard (:func:`shard_flat_batch`).

    Every rank of a sequence-parallel group is given the same examples (one micro-batch per
    group) and keeps its own ``1 / size`` of the row.

    >>> from packing_collators import FlatteningCollator
    >>> collate = SequenceShardCollator(FlatteningCollator(), rank=0, size=2)
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    >>> batch["input_ids"].tolist(), batch["shift_labels"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[1, 2, 3]], [[2, 3, -100]], [0, 3, 5, 6])
    """

    def __init__(self, collator, *, rank: int, size: int, pad_token_id: int = 0) -> None:
        if not callable(collator):
            raise TypeError(f"collator must be callable (e.g. FlatteningCollator()), got {type(collator).__name__}.")
        if not isinstance(size, int) or size < 1 or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, size) and size a positive integer; got rank={rank}, size={size}.")
        self.collator, self.rank, self.size, self.pad_token_id = collator, rank, size, pad_token_id

    def __repr__(self) -> str:
        return f"SequenceShardCollator({self.collator!r}, rank={self.rank}, size={self.size})"

    def __call__(self, features):
        batch = self.collator(features)
        return shard_flat_batch(batch, rank=self.rank, size=self.size, pad_token_id=self.pad_token_id)
