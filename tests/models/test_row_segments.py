"""RowSegments: every token goes to exactly one padded slot and comes back; groups bound the padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packing_collators.models import row_segments


@pytest.mark.parametrize("seed", range(20))
def test_round_trip_and_padding_bound(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, size=rng.integers(2, 40))
    cu = torch.tensor(np.r_[0, np.cumsum(lengths)], dtype=torch.int32)
    tokens = int(lengths.sum())
    segments = row_segments((1, tokens), cu_seq_lens=cu)
    x = torch.randn(1, tokens, 3)
    padded = [segments.to_padded(x, g) for g in range(len(segments.groups))]
    assert torch.equal(segments.from_padded(padded), x)
    assert sorted(segments.scatter.tolist()) == sorted(set(segments.scatter.tolist()))  # one slot per token
    slots = sum(p.shape[0] * p.shape[1] for p in padded)
    assert slots < 2 * tokens  # each group's rows are longer than half its longest
    for p, gather in zip(padded, segments.groups):  # each row one example, from its first token, padding last
        real = gather < tokens
        assert torch.equal(real, real.cummin(dim=1).values)
        starts = gather[:, 0].tolist()
        assert set(starts) <= set(cu[:-1].tolist())


def test_rows_of_a_padded_prepacked_batch():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]])
    segments = row_segments((2, 6), position_ids=positions)
    assert segments.cu_seq_lens.tolist() == [0, 3, 5, 6, 8, 12]
    assert segments.seq_idx().tolist() == [[0, 0, 0, 1, 1, 2], [3, 3, 4, 4, 4, 4]]


def test_a_cu_seq_lens_that_does_not_cover_the_row_is_refused():
    with pytest.raises(ValueError, match=r"does not split the batch's 9 tokens"):
        row_segments((1, 9), cu_seq_lens=torch.tensor([0, 3, 8]))
