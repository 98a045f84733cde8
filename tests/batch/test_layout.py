"""SegmentLayout: positions, boundaries and segment ids of segments laid end to end."""

import numpy as np
import pytest

from packing_collators.batch import segment_layout


@pytest.mark.parametrize("seed", range(10))
def test_layout_matches_a_python_loop(seed):
    lengths = np.random.default_rng(seed).integers(1, 50, size=20)
    layout = segment_layout(lengths)
    positions = [p for n in lengths for p in range(n)]
    seq_idx = [i for i, n in enumerate(lengths) for _ in range(n)]
    assert layout.position_ids().tolist() == positions
    assert layout.position_ids(2).tolist() == [p + 2 for p in positions]
    assert layout.seq_idx().tolist() == seq_idx
    assert layout.cu_seq_lens.tolist() == [0] + np.cumsum(lengths).tolist()
    assert layout.cu_seq_lens.dtype == np.int32 and layout.seq_idx().dtype == np.int32
    assert layout.position_ids().dtype == np.int64
    assert layout.max_length == lengths.max() and layout.total == lengths.sum()


def test_no_segments():
    layout = segment_layout([])
    assert layout.cu_seq_lens.tolist() == [0] and layout.max_length == 0 and layout.position_ids().tolist() == []
