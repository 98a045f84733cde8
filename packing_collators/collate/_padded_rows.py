"""Packing token sequences into padded rows of fixed length (the tensor API).

Four sequences of 3, 2, 4 and 3 tokens packed into rows of 8 (next-fit, the default here as in the
fast_axolotl Token Packing API these functions mirror: greedily, in order)::

    tokens = [[ 1,  2,  3,  4,  5,  0,  0,  0],     S0 S0 S0 S1 S1 pad pad pad
              [ 6,  7,  8,  9, 10, 11, 12,  0]]     S2 S2 S2 S2 S3 S3  S3 pad
    boundaries = [[(0, 3), (3, 5)], [(0, 4), (4, 7)]]
    position_ids = [[ 0,  1,  2,  0,  1,  0,  1,  2],   (return_position_ids=True)
                    [ 0,  1,  2,  3,  0,  1,  2,  0]]   the padding is a segment of its own

``strategy="bfd"`` (the default of every other packer here) gives the fewest rows instead.

The bare rows do not keep their sequences apart: fed to a model with only the
attention mask, every sequence attends to the ones before it in its row (the mask
hides just the padding). Pass ``return_position_ids=True`` and call
``model(input_ids=rows, position_ids=positions)`` with no attention mask: positions
restart at 0 for every sequence, so transformers' packed-sequence masks (sdpa, eager,
flex) keep each sequence to itself, and the loss is the padded loss (with no KV cache:
``use_cache=False`` in the call or the model's config, as in any packed training).
Rows are built with one scatter of the concatenated tokens (no loop over tokens).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._ranges import ranges
from ..engine import Overflow, PackingResult, Strategy, pack_lengths
from ..batch import segment_layout
from ._concat import concat_tokens
from ._features import check_same_lengths, sequence_lengths

__all__ = ["concatenate_and_pack", "into_rows", "pack_sequences"]


def into_rows(values: np.ndarray, target: np.ndarray, shape: tuple[int, int], fill: int) -> np.ndarray:
    """int64 ``shape``: ``values`` placed at the flat positions ``target`` of padded rows, ``fill`` elsewhere.

    ``target`` is ``ranges(row * width + column, lengths)``: each run of tokens from where it starts in its row.

    >>> into_rows(np.array([5, 6, 7, 8]), ranges([0, 4], [3, 1]), (2, 3), fill=0).tolist()
    [[5, 6, 7], [0, 8, 0]]
    """
    out = np.full(shape[0] * shape[1], fill, np.int64)
    out[target] = values
    return out.reshape(shape)


def _warn_losses(result: PackingResult) -> None:
    """Say, by count, what did not make it into the rows whole."""
    parts = []
    if result.num_truncated:
        parts.append(
            f"truncated {result.num_truncated} sequence(s) to {result.capacity} tokens ({result.truncated_tokens} tokens cut)"
        )
    if result.num_dropped:
        parts.append(
            f"dropped {result.num_dropped} sequence(s) longer than {result.capacity} ({result.dropped_tokens} tokens)"
        )
    if result.num_empty:
        parts.append(f"skipped {result.num_empty} empty sequence(s) (indices {result.empty_indices[:10].tolist()})")
    if parts:
        # 4: the caller of pack_sequences / concatenate_and_pack (through _pack_flat and this function)
        warnings.warn("Packing " + "; ".join(parts) + ".", stacklevel=4)


def _scatter_rows(flat: np.ndarray, result: PackingResult, starts: np.ndarray, fill: int) -> np.ndarray:
    """int64 (rows, capacity): the packed examples' tokens placed row by row, ``fill`` elsewhere.

    ``flat`` holds every example laid end to end and ``starts`` where each begins.
    """
    n_rows, width = result.num_rows, result.capacity
    lengths = result.length
    row_of_entry = np.repeat(np.arange(n_rows), np.diff(result.row_offsets))
    entry_ends = np.cumsum(lengths)
    row_start_in_entries = np.r_[0, entry_ends][result.row_offsets[:-1]]
    column_of_entry = entry_ends - lengths - row_start_in_entries[row_of_entry]
    target = ranges(row_of_entry * width + column_of_entry, lengths)
    return into_rows(flat[ranges(starts[result.example], lengths)], target, (n_rows, width), fill)


def _boundaries(result: PackingResult) -> list[list[tuple[int, int]]]:
    ends = np.cumsum(result.length)
    row_base = np.r_[0, ends][result.row_offsets[:-1]]
    bounds = []
    for row in range(result.num_rows):
        lo, hi = result.row_offsets[row], result.row_offsets[row + 1]
        stop = (ends[lo:hi] - row_base[row]).tolist()
        start = [0] + stop[:-1]
        bounds.append(list(zip(start, stop)))
    return bounds


def _row_positions(result: PackingResult) -> np.ndarray:
    """int64 (rows, capacity): positions restarting at 0 for every sequence and for each row's padding."""
    width, lengths = result.capacity, result.length
    used = np.add.reduceat(lengths, result.row_offsets[:-1]) if result.num_rows else np.zeros(0, np.int64)
    segments = np.insert(lengths, result.row_offsets[1:], width - used)  # each row's sequences, then its padding
    layout = segment_layout(segments[segments > 0])
    return layout.position_ids().reshape(result.num_rows, width)


def _pack_flat(sequences, max_length, strategy, overflow, what="sequences"):
    lengths = sequence_lengths(sequences, what=what)
    flat = concat_tokens(sequences, int(lengths.sum()), what=what)
    result = pack_lengths(lengths, max_length, strategy=strategy, overflow=overflow)
    _warn_losses(result)
    starts = np.r_[0, np.cumsum(lengths)[:-1]] if len(lengths) else np.empty(0, np.int64)
    return lengths, flat, result, starts


def pack_sequences(
    sequences: Sequence[Any],
    max_length: int,
    pad_token_id: int,
    *,
    return_boundaries: bool = False,
    return_position_ids: bool = False,
    strategy: Strategy = "next_fit",
    overflow: Overflow = "error",
):
    """Pack token sequences into a ``torch.long`` tensor of rows, right-padded with ``pad_token_id``.

    Args:
        sequences: 1-D tensors, numpy arrays or lists of token ids.
        max_length: tokens per row.
        pad_token_id: fills the end of each row.
        return_boundaries: also return, per row, the ``(start, end)`` of each sequence in it.
        return_position_ids: also return int64 (rows, max_length) positions restarting at 0
            for every sequence and for the padding (a segment of its own), last.
        strategy: ``"next_fit"`` (default, as in the seed API: sequences stay in order, a row is
            closed when the next one does not fit), or ``"bfd"`` / ``"ffd"`` (the fewest rows; a row
            lists its sequences in input order).
        overflow: for a sequence longer than ``max_length``: ``"error"``, ``"truncate"`` or ``"drop"``
            (counted in a warning). Empty sequences are skipped with a warning.

    Returns:
        int64 (rows, max_length); then the boundaries and the position ids, each if asked for.
        No sequences at all give a (0, max_length) tensor.

    The bare rows let the sequences of a row attend to each other (with an attention mask
    that hides only the padding). To train on them as if each sequence were alone, ask for
    the position ids and call ``model(input_ids=rows, position_ids=positions)`` without an
    attention mask (sdpa, eager, flex) and with ``use_cache=False`` (a cache switches the
    packed-sequence masks off): transformers then keeps every sequence to itself.

    >>> import torch
    >>> from torch import tensor
    >>> pack_sequences([tensor([1,2,3]), tensor([4,5]), tensor([6,7,8,9]), tensor([10,11,12])],
    ...                max_length=8, pad_token_id=0)
    tensor([[ 1,  2,  3,  4,  5,  0,  0,  0],
            [ 6,  7,  8,  9, 10, 11, 12,  0]])
    >>> rows, bounds = pack_sequences([[1, 2, 3], [4, 5]], max_length=4, pad_token_id=0, return_boundaries=True)
    >>> rows.tolist(), bounds
    ([[1, 2, 3, 0], [4, 5, 0, 0]], [[(0, 3)], [(0, 2)]])
    >>> rows, positions = pack_sequences([[1, 2, 3], [4, 5], [6]], max_length=4, pad_token_id=0, return_position_ids=True)
    >>> rows.tolist(), positions.tolist()
    ([[1, 2, 3, 0], [4, 5, 6, 0]], [[0, 1, 2, 0], [0, 1, 0, 0]])
    >>> pack_sequences([[1, 2, 3], [4, 5], [6]], max_length=4, pad_token_id=0, strategy="bfd").tolist()
    [[1, 2, 3, 6], [4, 5, 0, 0]]
    """
    import torch

    _, flat, result, starts = _pack_flat(sequences, max_length, strategy, overflow)
    out = [torch.from_numpy(_scatter_rows(flat, result, starts, pad_token_id))]
    if return_boundaries:
        out.append(_boundaries(result))
    if return_position_ids:
        out.append(torch.from_numpy(_row_positions(result)))
    return out[0] if len(out) == 1 else tuple(out)


def concatenate_and_pack(
    input_sequences: Sequence[Any],
    label_sequences: Sequence[Any],
    attention_masks: Sequence[Any],
    max_length: int,
    pad_token_id: int,
    label_pad_id: int = -100,
    *,
    return_position_ids: bool = False,
    strategy: Strategy = "next_fit",
    overflow: Overflow = "error",
):
    """Pack inputs, labels and attention masks together, so each label stays with its token.

    The first label of every sequence becomes ``label_pad_id``: a causal LM would
    otherwise be trained to predict it from the previous sequence's last token
    (for a sequence on its own that label is never used, so the loss matches padding).
    Padding is ``pad_token_id`` in inputs, ``label_pad_id`` in labels and 0 in masks.

    The masks hide only the padding: a model given ``attention_mask=masks`` lets the
    sequences of a row attend to each other. For the padded loss, pass
    ``return_position_ids=True`` and call ``model(input_ids=inputs, labels=labels,
    position_ids=positions, use_cache=False)`` without the masks (sdpa, eager, flex):
    positions restart at 0 for every sequence and for the padding (a segment of its own),
    and transformers keeps every sequence to itself.

    ``strategy`` and ``overflow`` are :func:`pack_sequences`'s (``"next_fit"`` by default: the rows keep
    the sequences' order).

    Returns:
        ``(packed_inputs, packed_labels, packed_masks)``, each int64 (rows, max_length);
        ``(packed_inputs, packed_labels, packed_masks, position_ids)`` with ``return_position_ids=True``.

    >>> inputs, labels, masks = concatenate_and_pack(
    ...     [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]], [[1, 1, 1], [1, 1]], max_length=6, pad_token_id=0)
    >>> inputs.tolist(), labels.tolist(), masks.tolist()
    ([[1, 2, 3, 4, 5, 0]], [[-100, 2, 3, -100, 5, -100]], [[1, 1, 1, 1, 1, 0]])
    >>> concatenate_and_pack([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]], [[1, 1, 1], [1, 1]], max_length=6,
    ...                      pad_token_id=0, return_position_ids=True)[3].tolist()
    [[0, 1, 2, 0, 1, 0]]
    >>> concatenate_and_pack([[1, 2]], [[1]], [[1, 1]], max_length=4, pad_token_id=0)
    Traceback (most recent call last):
    ...
    ValueError: Example 0: labels has 1 tokens but input_ids has 2; they must be the same length.
    """
    import torch

    lengths = sequence_lengths(input_sequences, what="input_ids")
    columns = (("labels", label_sequences), ("attention_mask", attention_masks))
    for key, column in columns:  # checked before packing, so no loss warning precedes the error
        if len(column) != len(lengths):
            raise ValueError(f"Got {len(lengths)} input sequences but {len(column)} {key}; give one per example.")
        check_same_lengths(sequence_lengths(column, what=key), lengths, key)
    lengths, flat_inputs, result, starts = _pack_flat(input_sequences, max_length, strategy, overflow, "input_ids")
    tables = [flat_inputs] + [
        concat_tokens(column, int(lengths.sum()), what=key, allow_bool=key == "attention_mask")
        for key, column in columns
    ]
    tables[1][starts[lengths > 0]] = label_pad_id
    fills = (pad_token_id, label_pad_id, 0)
    packed = tuple(torch.from_numpy(_scatter_rows(t, result, starts, f)) for t, f in zip(tables, fills))
    return (*packed, torch.from_numpy(_row_positions(result))) if return_position_ids else packed
