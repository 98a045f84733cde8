"""The bin-packing algorithms, checked against straightforward one-item-at-a-time versions."""

import numpy as np
import pytest

from packing_collators.engine._strategies import best_fit_decreasing, first_fit_decreasing, next_fit


def reference_bfd(lengths, capacity):
    """Textbook BFD: longest first (ties by index), into the bin with the least room that fits."""
    free = []
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        fits = [b for b, room in enumerate(free) if room >= lengths[i]]
        if fits:
            best = min(fits, key=lambda b: free[b])
            free[best] -= lengths[i]
        else:
            free.append(capacity - lengths[i])
    return sorted(free)


def reference_ffd(lengths, capacity):
    bins, free = [], []
    for i in np.argsort(-np.asarray(lengths), kind="stable"):
        for b, room in enumerate(free):
            if room >= lengths[i]:
                free[b] -= lengths[i]
                bins.append((i, b))
                break
        else:
            free.append(capacity - lengths[i])
            bins.append((i, len(free) - 1))
    out = np.empty(len(lengths), np.int64)
    for i, b in bins:
        out[i] = b
    return out, len(free)


def reference_next_fit(lengths, capacity):
    out, row, used = [], 0, 0
    for length in lengths:
        if used + length > capacity:
            row, used = row + 1, 0
        out.append(row)
        used += length
    return out, (row + 1 if len(lengths) else 0)


def random_case(seed, *, min_items):
    """Up to 299 lengths in [1, capacity] for a capacity in [4, 199], from the seed."""
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(4, 200))
    return rng.integers(1, capacity + 1, size=int(rng.integers(min_items, 300))), capacity


def free_space(bin_of_item, num_bins, lengths, capacity):
    used = np.bincount(bin_of_item, weights=lengths, minlength=num_bins)
    return sorted((capacity - used).astype(int).tolist())


@pytest.mark.parametrize("seed", range(30))
def test_bfd_matches_textbook_bfd(seed):
    lengths, capacity = random_case(seed, min_items=1)
    bin_of_item, num_bins = best_fit_decreasing(lengths, capacity)
    # Ties between bins with equal room may be broken differently; the bins' fill levels may not.
    assert free_space(bin_of_item, num_bins, lengths, capacity) == reference_bfd(lengths.tolist(), capacity)


@pytest.mark.parametrize("seed", range(30))
def test_ffd_matches_textbook_ffd_exactly(seed):
    lengths, capacity = random_case(seed, min_items=1)
    bin_of_item, num_bins = first_fit_decreasing(lengths, capacity)
    expected, expected_bins = reference_ffd(lengths.tolist(), capacity)
    assert num_bins == expected_bins
    assert bin_of_item.tolist() == expected.tolist()


@pytest.mark.parametrize("seed", range(30))
def test_next_fit_matches_reference_exactly(seed):
    lengths, capacity = random_case(seed, min_items=0)
    bin_of_item, num_bins = next_fit(lengths, capacity)
    expected, expected_bins = reference_next_fit(lengths.tolist(), capacity)
    assert (bin_of_item.tolist(), num_bins) == (expected, expected_bins)


@pytest.mark.parametrize("strategy", [best_fit_decreasing, first_fit_decreasing, next_fit])
def test_empty_input_gives_no_bins(strategy):
    bin_of_item, num_bins = strategy(np.empty(0, np.int64), 16)
    assert len(bin_of_item) == 0 and num_bins == 0


@pytest.mark.parametrize("strategy", [best_fit_decreasing, first_fit_decreasing])
def test_many_equal_items_fill_bins_exactly(strategy):
    # 1000 items of 3 into bins of 10: 3 per bin, the last bin holds one.
    bin_of_item, num_bins = strategy(np.full(1000, 3), 10)
    assert num_bins == 334
    assert np.bincount(bin_of_item).max() == 3
