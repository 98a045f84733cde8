"""Where each packed example sits in the batch a model is called with, and the same tokens as padded batches.

A flat row of three examples (lengths 3, 2, 4), and the padded batch that a layer which carries
state along the sequence runs on, one example per row, so that no state crosses a boundary::

    row     (1, 9):  a b c | d e | f g h i       cu_seq_lens [0, 3, 5, 9]   (read_layout: the batch's one rule)
    group 0 (2, 4):  f g h i                     gather [[5, 6, 7, 8], [0, 1, 2, 9]]   (9: a zero row)
                     a b c .
    group 1 (1, 2):  d e                         gather [[3, 4]]
    scatter:         [4, 5, 6, 8, 9, 0, 1, 2, 3]  each token's slot in the groups' slots, back to the row

Padding sits after each example's last token, so a causal layer (a short convolution, a scan)
computes every real token exactly as it would for the example alone. Examples are grouped by
length, longest first, into padded batches whose lengths stay within a factor of two of each
other (``group``): a row of 40 examples of 10 to 2,000 tokens is a few batches, and at most
half of any batch is padding, instead of 40 rows of 2,000. Several packed rows
(``PrePackedCollator(mode="pad")``, position_ids restarting inside each row) are read the same
way over the flattened ``B * T`` tokens. The examples are the batch's as every reader finds them
(``packing_collators.batch``: ``cu_seq_lens_q`` of one row, else restarting ``position_ids``).
Cost: one host read of the boundaries per forward, then two gathers per layer call and group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import CU_SEQ_LENS_Q, SegmentLayout, segment_starts

__all__ = ["RowSegments", "row_segments"]


@dataclass(frozen=True, eq=False)
class RowSegments:
    """The examples of one batch: their boundaries and the gathers between the batch and padded batches.

    Attributes:
        batch_shape: (B, T) of the batch the model was called with.
        layout: the examples over the flattened ``B * T`` tokens (host).
        cu_seq_lens: int32 (S + 1,) the layout's boundaries, on the batch's device.
        groups: int64 (S_g, L_g) per group: the token of each padded slot (``B * T`` for a padding slot).
        scatter: int64 (B * T,) slot of each token in the groups' slots, flattened and concatenated.
    """

    batch_shape: tuple[int, int]
    layout: SegmentLayout
    cu_seq_lens: torch.Tensor
    groups: tuple[torch.Tensor, ...]
    scatter: torch.Tensor

    @property
    def count(self) -> int:
        """How many examples (segments) the batch holds."""
        return self.layout.count

    @property
    def max_length(self) -> int:
        """The longest example."""
        return self.layout.max_length

    @property
    def tokens(self) -> int:
        return self.batch_shape[0] * self.batch_shape[1]

    def gather_source(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (B * T + 1, ...): the tokens flattened and a zero row after them (the padding's)."""
        flat = x.reshape(self.tokens, *x.shape[2:])
        return torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])

    def to_padded(self, x: torch.Tensor, group: int, source: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, ...) -> (S_g, L_g, ...) of ``group``: each example in a row of its own, zeros after it
        (``source``: ``gather_source(x)``, made once for all the groups)."""
        return (self.gather_source(x) if source is None else source)[self.groups[group]]

    def from_padded(self, ys: list[torch.Tensor]) -> torch.Tensor:
        """One (S_g, L_g, ...) per group -> (B, T, ...): the real tokens back in the batch's order."""
        flat = torch.cat([y.reshape(-1, *y.shape[2:]) for y in ys])[self.scatter]
        return flat.reshape(*self.batch_shape, *ys[0].shape[2:])

    def seq_idx(self) -> torch.Tensor:
        """int32 (B, T): the example each token belongs to (numbered across the whole batch)."""
        lengths = self.cu_seq_lens[1:] - self.cu_seq_lens[:-1]
        ids = torch.arange(self.count, device=lengths.device, dtype=torch.int32)
        return torch.repeat_interleave(ids, lengths.long()).reshape(self.batch_shape)


def _groups(lengths: list[int]) -> list[list[int]]:
    """Example indices, longest first, cut where a length falls to half the group's first (or below)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if not groups or 2 * lengths[i] <= lengths[groups[-1][0]]:
            groups.append([])
        groups[-1].append(i)
    return groups


def _gathers(layout: SegmentLayout, batch_shape: tuple[int, int], device) -> RowSegments:
    """The gathers for ``layout``'s segments, on ``device``."""
    sizes = layout.lengths.tolist()
    tokens = batch_shape[0] * batch_shape[1]
    lengths = torch.as_tensor(layout.lengths, device=device)
    cu = torch.as_tensor(layout.cu_seq_lens, device=device).long()
    gathers, slot_of = [], torch.empty(tokens, dtype=torch.int64, device=device)
    offset = 0
    for members in _groups(sizes):
        index = torch.tensor(members, device=device)
        width = sizes[members[0]]
        slot = torch.arange(width, device=device)
        gather = cu[index, None] + slot[None]
        real = slot[None] < lengths[index, None]
        gathers.append(torch.where(real, gather, torch.full_like(gather, tokens)))
        slot_of[gather[real]] = offset + torch.nonzero(real.reshape(-1)).reshape(-1)
        offset += len(members) * width
    return RowSegments(batch_shape, layout, cu.to(torch.int32), tuple(gathers), slot_of)


def row_segments(
    batch_shape: tuple[int, int], *, cu_seq_lens: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
) -> RowSegments | None:
    """The examples of a batch of ``batch_shape`` (B, T), from its ``cu_seq_lens_q`` (one row) or its
    ``position_ids`` (restarts), or None when the batch is not packed (one example per row).

    >>> segments = row_segments((1, 9), cu_seq_lens=torch.tensor([0, 3, 5, 9], dtype=torch.int32))
    >>> [gather.tolist() for gather in segments.groups]
    [[[5, 6, 7, 8], [0, 1, 2, 9]], [[3, 4]]]
    >>> segments.scatter.tolist()
    [4, 5, 6, 8, 9, 0, 1, 2, 3]
    >>> row = torch.arange(9.0)[None, :, None]
    >>> bool((segments.from_padded([segments.to_padded(row, g) for g in range(2)]) == row).all())
    True
    >>> row_segments((2, 4), position_ids=torch.tensor([[0, 1, 0, 1], [0, 1, 2, 0]])).cu_seq_lens.tolist()
    [0, 2, 4, 7, 8]
    >>> row_segments((2, 3), position_ids=torch.tensor([[0, 1, 2], [0, 1, 2]])) is None
    True
    """
    starts = segment_starts({CU_SEQ_LENS_Q: cu_seq_lens, "position_ids": position_ids}, batch_shape)
    first = torch.nonzero(starts.reshape(-1)).reshape(-1)
    if first.numel() <= batch_shape[0]:
        return None  # one example per row: nothing to keep apart
    layout = SegmentLayout.from_cu_seq_lens(torch.cat([first, first.new_tensor([starts.numel()])]).cpu().numpy())
    return _gathers(layout, batch_shape, starts.device)
