"""Where the examples of a batch start: the one rule every reader of a packed batch follows.

    a one-row batch with cu_seq_lens_q   [0, 3, 5, 9]                     starts at tokens 0, 3 and 5
    else its position_ids                [[0, 1, 2, 0, 1, 0, 1, 2, 3]]    a start wherever a position is not the
                                                                          previous + 1, and at each row's first token
    else                                 one example per row

The second line is transformers' own rule for packed sequences; a collated batch (``cu_seq_lens_q``
and restarting ``position_ids`` built together) reads the same by either line. Multimodal rotary
positions, ``(3 or 4, B, T)``, are read by their first row, the text positions. The attention checks,
the models' stateful layers, the per-sequence loss, NEFTune's noise, the metrics and the
predictions split per example all read a batch's examples here. Torch on the batch's device
(numpy batches are viewed as tensors): :func:`segment_starts`, :func:`segment_ids` and
:func:`segment_count` never wait on the device; :func:`read_layout` reads the starts to the host once.
Cost: one comparison over the positions, or a scatter of the ``n`` boundaries, per batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._keys import CU_SEQ_LENS_Q, IGNORE_INDEX
from ._layout import SegmentLayout

__all__ = ["batch_shape", "check_boundary_count", "padding_tail", "read_layout", "segment_count", "segment_ids",
           "segment_starts"]  # fmt: skip


def _tensor(value):
    import torch

    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


def batch_shape(batch: Mapping[str, Any]) -> tuple[int, int]:
    """``(B, T)`` of a batch: its ``input_ids`` (else ``inputs_embeds``, else ``labels``)."""
    for key in ("input_ids", "inputs_embeds", "labels"):
        shape = getattr(batch.get(key), "shape", None)
        if shape is not None and len(shape) >= 2:
            return int(shape[0]), int(shape[1])
    raise ValueError(f"A batch needs input_ids (or inputs_embeds) of shape (B, T) to read its examples; got {sorted(batch)}.")


def _device(batch: Mapping[str, Any]):
    for key in ("input_ids", "inputs_embeds", "labels", "position_ids"):
        device = getattr(batch.get(key), "device", None)
        if device is not None and not isinstance(device, str):  # numpy arrays: "cpu" (a str) since numpy 2
            return device
    return None


def check_boundary_count(cu_seq_lens, name: str = CU_SEQ_LENS_Q) -> None:
    """Refuse boundaries of no sequence (fewer than 2 entries), naming what cuts them: a data loader that slices
    every tensor of a batch along its first dimension (accelerate's ``dispatch_batches``, on by default for an
    ``IterableDataset``, gives each rank ``cu_seq_lens[:1]``). Shapes only: no device sync.

    >>> import torch
    >>> check_boundary_count(torch.tensor([0, 3, 5]))
    >>> check_boundary_count(torch.tensor([0]))
    Traceback (most recent call last):
    ...
    ValueError: cu_seq_lens_q=[0] holds no sequence: something between the collator and the model cut it, as accelerate's dispatch_batches does for an IterableDataset (it slices every tensor of the batch, and a packed row's boundaries are not one per row). Pass TrainingArguments(accelerator_config={"dispatch_batches": False}), or a map-style dataset.
    """
    if cu_seq_lens.numel() < 2:
        raise ValueError(
            f"{name}={cu_seq_lens.reshape(-1).tolist()} holds no sequence: something between the collator and the model cut it, as accelerate's "
            "dispatch_batches does for an IterableDataset (it slices every tensor of the batch, and a packed row's "
            'boundaries are not one per row). Pass TrainingArguments(accelerator_config={"dispatch_batches": False}), '
            "or a map-style dataset."
        )


def _starts_from_cu_seq_lens(cu_seq_lens, width: int):
    """bool (1, T): True at each non-empty segment's first token, once ``cu_seq_lens`` is checked to split ``T``."""
    import torch

    cu = _tensor(cu_seq_lens).reshape(-1).long()
    check_boundary_count(cu)
    first, last, falls = torch.stack((cu[0], cu[-1], cu.diff().clamp(max=0).sum())).tolist()  # one host read
    if first != 0 or last != width or falls:
        raise ValueError(
            f"cu_seq_lens_q={cu.tolist()[:8]}... does not split the batch's {width} tokens (it must start at 0, never "
            "decrease and end at the token count); collate with FlatteningCollator, which builds both together."
        )
    starts = torch.zeros(width + 1, dtype=torch.bool, device=cu.device)
    starts[cu[:-1]] = True  # an empty segment's start is the next one's (or T: dropped below)
    return starts[None, :width]


def _starts_from_positions(position_ids, rows: int, width: int):
    """bool (B, T): True where a position is not the previous + 1, and at each row's first token; None when
    the positions are not laid out as the batch's tokens."""
    import torch

    positions = _tensor(position_ids)
    if positions.dim() == 3:  # multimodal rope (3 or 4, B, T): the first row numbers the text
        positions = positions[0]
    if positions.numel() != rows * width:
        return None
    positions = positions.reshape(rows, width)
    starts = torch.ones((rows, width), dtype=torch.bool, device=positions.device)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    return starts


def segment_starts(batch: Mapping[str, Any], shape: tuple[int, int] | None = None):
    """bool (B, T): True at the first token of each example of ``batch`` (of ``shape``, default its own).

    >>> import torch
    >>> segment_starts({"input_ids": torch.zeros(1, 5), "cu_seq_lens_q": torch.tensor([0, 3, 5])}).int().tolist()
    [[1, 0, 0, 1, 0]]
    >>> segment_starts({"position_ids": torch.tensor([[0, 1, 0, 1], [0, 1, 2, 0]])}, (2, 4)).int().tolist()
    [[1, 0, 1, 0], [1, 0, 0, 1]]
    >>> segment_starts({"input_ids": torch.zeros(2, 3)}).int().tolist()  # nothing packed: a row is an example
    [[1, 0, 0], [1, 0, 0]]
    """
    import torch

    rows, width = shape if shape is not None else batch_shape(batch)
    cu = batch.get(CU_SEQ_LENS_Q)
    if cu is not None and rows == 1:
        return _starts_from_cu_seq_lens(cu, width)
    positions = batch.get("position_ids")
    starts = None if positions is None else _starts_from_positions(positions, rows, width)
    if starts is None:
        starts = torch.zeros((rows, width), dtype=torch.bool, device=_device(batch))
        starts[:, :1] = True
    return starts


def segment_ids(batch: Mapping[str, Any], shape: tuple[int, int] | None = None):
    """int64 (B, T): the example each token belongs to, numbered over the whole batch.

    >>> import torch
    >>> segment_ids({"position_ids": torch.tensor([[0, 1, 0, 1], [0, 1, 2, 0]])}, (2, 4)).tolist()
    [[0, 0, 1, 1], [2, 2, 2, 3]]
    """
    import torch

    starts = segment_starts(batch, shape)
    return (torch.cumsum(starts.reshape(-1), 0) - 1).reshape(starts.shape)


def segment_count(batch: Mapping[str, Any]):
    """How many examples ``batch`` holds (a 0-dim tensor on its device, never waited on).

    A one-row batch's ``cu_seq_lens_q`` is counted without checking it against the row: a sequence
    shard's are the whole row's (its examples, counted once by the group).

    >>> import torch
    >>> int(segment_count({"input_ids": torch.zeros(1, 4), "position_ids": torch.tensor([[0, 1, 0, 0]])}))
    3
    """
    cu = batch.get(CU_SEQ_LENS_Q)
    if cu is not None and batch_shape(batch)[0] == 1:
        cu = _tensor(cu).reshape(-1)
        return (cu[1:] > cu[:-1]).sum()
    return segment_starts(batch).sum()


def padding_tail(batch: Mapping[str, Any], pad_token_id: int):
    """The tokens of a one-row ``batch``'s last example when it is a bucket's padding (every token ``pad_token_id``,
    no target: what ``FlatteningCollator(pad_to_buckets=...)`` appends), else 0; a 0-dim int64 tensor on the
    batch's device, never waited on. A row of one example, or a batch of several rows, has none.

    >>> import torch
    >>> row = {"input_ids": torch.tensor([[5, 6, 7, 0, 0]]), "labels": torch.tensor([[-100, 6, 7, -100, -100]]),
    ...        "cu_seq_lens_q": torch.tensor([0, 3, 5])}
    >>> int(padding_tail(row, 0)), int(padding_tail({**row, "input_ids": torch.tensor([[5, 6, 7, 0, 9]])}, 0))
    (2, 0)
    >>> int(padding_tail({"input_ids": row["input_ids"], "labels": row["labels"],
    ...                   "position_ids": torch.tensor([[0, 1, 2, 0, 1]])}, 0))
    2
    """
    import torch

    rows, width = batch_shape(batch)
    ids, labels = batch.get("input_ids"), batch.get("labels")
    if rows != 1 or ids is None or labels is None:
        return torch.zeros((), dtype=torch.int64, device=_device(batch))
    ids, labels = _tensor(ids).reshape(-1), _tensor(labels).reshape(-1)
    cu = batch.get(CU_SEQ_LENS_Q)
    if cu is not None:
        cu = _tensor(cu).reshape(-1).to(ids.device).long()
        start = cu[-2] if cu.numel() > 2 else cu.new_tensor(width)  # one example: no padding
    else:
        segments = segment_ids(batch).reshape(-1).to(ids.device)
        start = (segments != segments[-1]).sum()
        start = torch.where(start == 0, width, start)
    tail = torch.arange(width, device=ids.device) >= start
    padding = ((ids == pad_token_id) | ~tail).all() & ((labels == IGNORE_INDEX) | ~tail).all()
    return torch.where(padding, width - start, 0).long()


def read_layout(batch: Mapping[str, Any], shape: tuple[int, int] | None = None) -> SegmentLayout:
    """The examples of ``batch`` as a :class:`SegmentLayout` over its ``B * T`` tokens, row after row (on the host).

    >>> import torch
    >>> read_layout({"position_ids": torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]])}, (2, 6)).cu_seq_lens.tolist()
    [0, 3, 5, 6, 8, 12]
    """
    import torch

    starts = segment_starts(batch, shape).reshape(-1)
    first = torch.nonzero(starts).reshape(-1).cpu().numpy()
    return SegmentLayout.from_cu_seq_lens(np.r_[first, starts.numel()])
