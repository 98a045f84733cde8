"""The standard length distributions come from one module, ``benchmarks/_lengths.py``, for tests and benchmarks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_fixture_is_the_benchmarks_function(standard_lengths):
    sys.path.insert(0, str(BENCHMARKS))
    import _lengths
    import _shared

    assert standard_lengths is _lengths.lengths_of is _shared.lengths_of


def test_sft_draw_is_seeded(standard_lengths):
    assert standard_lengths("sft", 5).tolist() == [224, 177, 356, 220, 123]
    assert standard_lengths("sft", 1000, seed=3).tolist() != standard_lengths("sft", 1000).tolist()


def test_long_tail_spreads_its_tail_up_to_high(standard_lengths):
    """The draw the committed benchmark numbers were made with: uniform(1500, high), not clipped at high."""
    lengths = standard_lengths("long_tail", 100_000, high=2048)
    assert int((lengths == 2048).sum()) == 7
    assert [int(standard_lengths("long_tail", 100_000, high=h).max()) for h in (2048, 8192, 32768)] == [
        2048,
        8190,
        32762,
    ]
    assert np.array_equal(standard_lengths("long_tail", 1000), standard_lengths("long_tail", 1000, high=8192))


def test_unknown_distribution_names_the_choices(standard_lengths):
    with pytest.raises(ValueError, match="unknown distribution 'nope'; choose one of sft, flan_like"):
        standard_lengths("nope", 3)
