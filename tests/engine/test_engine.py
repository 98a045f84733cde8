"""pack_lengths: the packing engine's contract, its statistics and its errors."""

import math

import numpy as np
import pytest

from packing_collators import PackingResult, pack_lengths

STRATEGIES = ["bfd", "ffd", "next_fit"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(15))
def test_every_index_in_exactly_one_row_and_no_row_over_capacity(strategy, seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(1, 300))
    lengths = rng.integers(0, capacity + 1, size=int(rng.integers(0, 500)))
    result = pack_lengths(lengths, capacity, strategy=strategy)
    placed = np.sort(np.r_[result.example, result.empty_indices])
    assert placed.tolist() == list(range(len(lengths)))
    assert (result.row_tokens <= capacity).all()
    assert (result.row_tokens > 0).all()
    assert result.total_tokens == lengths.sum() == result.input_tokens
    assert result.length.tolist() == lengths[result.example].tolist()
    assert result.empty_indices.tolist() == np.flatnonzero(lengths == 0).tolist()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overflow", ["truncate", "drop"])
@pytest.mark.parametrize("seed", range(10))
def test_tokens_in_equal_tokens_out_plus_reported_losses(strategy, overflow, seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(5, 100))
    lengths = rng.integers(0, 3 * capacity, size=200)
    result = pack_lengths(lengths, capacity, strategy=strategy, overflow=overflow)
    too_long = np.flatnonzero(lengths > capacity)
    assert result.input_tokens == lengths.sum()
    assert result.total_tokens + result.truncated_tokens + result.dropped_tokens == lengths.sum()
    assert (result.row_tokens <= capacity).all()
    if overflow == "truncate":
        assert result.truncated_indices.tolist() == too_long.tolist()
        assert result.truncated_tokens == (lengths[too_long] - capacity).sum()
        assert result.num_dropped == 0
    else:
        assert result.dropped_indices.tolist() == too_long.tolist()
        assert result.dropped_tokens == lengths[too_long].sum()
        assert not set(result.example.tolist()) & set(too_long.tolist())
    accounted = np.sort(np.r_[result.example, result.dropped_indices, result.empty_indices])
    assert accounted.tolist() == list(range(len(lengths)))


def test_rows_hold_indices_in_dataset_order(standard_lengths):
    result = pack_lengths(standard_lengths("sft", 2000), 2048)
    for row in result.rows:
        assert row == sorted(row)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_deterministic(strategy, standard_lengths):
    lengths = standard_lengths("sft", 5000, seed=3)
    a = pack_lengths(lengths, 2048, strategy=strategy)
    b = pack_lengths(lengths.tolist(), 2048, strategy=strategy)
    assert a.rows == b.rows


def test_bfd_is_near_the_lower_bound_on_sft_lengths(standard_lengths):
    result = pack_lengths(standard_lengths("sft", 20_000), 2048)
    assert result.lower_bound_rows == math.ceil(result.total_tokens / 2048)
    assert result.num_rows - result.lower_bound_rows <= 5
    assert result.efficiency > 0.999


def test_next_fit_keeps_order():
    result = pack_lengths([3, 2, 4, 3, 8, 1], 8, strategy="next_fit")
    assert result.rows == [[0, 1], [2, 3], [4], [5]]
    assert result.example.tolist() == list(range(6))


def test_literal_statistics():
    result = pack_lengths([5, 2, 4, 1, 3, 0], 8)
    assert isinstance(result, PackingResult)
    assert result.rows == [[0, 4], [1, 2, 3]]
    assert len(result) == 2 and result[1] == [1, 2, 3] and list(result) == result.rows
    assert result.row_tokens.tolist() == [8, 7]
    stats = result.stats()
    assert stats["rows"] == 2 and stats["lower_bound_rows"] == 2 and stats["empty_examples"] == 1
    assert stats["efficiency"] == pytest.approx(15 / 16)
    assert "empty 1" in result.summary()


def test_no_examples():
    result = pack_lengths([], 8)
    assert result.num_rows == 0 and result.efficiency == 1.0 and result.rows == []


def test_only_empty_examples():
    result = pack_lengths([0, 0], 8)
    assert result.num_rows == 0 and result.empty_indices.tolist() == [0, 1]


def test_truncated_example_gets_a_full_row():
    result = pack_lengths([20, 3], 8, overflow="truncate")
    assert result.rows == [[0], [1]]
    assert result.length.tolist() == [8, 3]
    assert (result.num_truncated, result.truncated_tokens) == (1, 12)


def test_integral_floats_are_accepted():
    assert pack_lengths(np.array([3.0, 5.0]), 8).rows == [[0, 1]]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(lengths=[3, 12, 4], capacity=8),
            ValueError,
            r"Example 1 has 12 tokens, more than capacity=8.*overflow='truncate'",
        ),
        (dict(lengths=[3, -1], capacity=8), ValueError, r"Example 1 has a negative length \(-1\)"),
        (dict(lengths=[1.5], capacity=8), TypeError, r"must be integers .*float64"),
        (dict(lengths=[[1, 2]], capacity=8), ValueError, r"one-dimensional"),
        (dict(lengths=[1], capacity=0), ValueError, r"capacity must be a positive integer, got 0"),
        (dict(lengths=[1], capacity=2.5), ValueError, r"capacity must be a positive integer"),
        (
            dict(lengths=[1], capacity=8, strategy="best"),
            ValueError,
            r"strategy='best' is not supported; choose one of 'bfd', 'ffd', 'next_fit'",
        ),
        (dict(lengths=[1], capacity=8, overflow="cut"), ValueError, r"overflow='cut' is not supported"),
    ],
)
def test_errors(kwargs, error, match):
    lengths = kwargs.pop("lengths")
    capacity = kwargs.pop("capacity")
    with pytest.raises(error, match=match):
        pack_lengths(lengths, capacity, **kwargs)
