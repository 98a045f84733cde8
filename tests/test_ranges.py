"""packing_collators/_ranges.py: runs of consecutive integers, against a Python loop."""

import numpy as np
import pytest

from packing_collators._ranges import ranges, segment_positions


@pytest.mark.parametrize("seed", range(20))
def test_ranges_match_a_loop_over_aranges(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, size=rng.integers(0, 12))
    starts = rng.integers(-50, 50, size=len(lengths))
    expected = [value for start, length in zip(starts, lengths) for value in range(start, start + length)]
    assert ranges(starts, lengths).tolist() == expected
    positions = [value for length in lengths for value in range(3, 3 + length)]
    assert segment_positions(lengths, start=3).tolist() == positions
    assert ranges(starts, lengths).dtype == np.int64


def test_empty_and_zero_lengths():
    assert ranges([], []).tolist() == []
    assert segment_positions([0, 2, 0, 1]).tolist() == [0, 1, 0]
