"""Bin-packing strategies: positive integer lengths in, a bin id per item out.

Each function takes ``lengths`` (int64, every value in ``[1, capacity]``) and
returns ``(bin_of_item, num_bins)`` where ``bin_of_item[i]`` is the bin that
item ``i`` went to. Nothing here knows about tokens, torch or datasets.

Best-fit decreasing is done on *counts*, not one item at a time. Items of the
same length are interchangeable, and so are bins with the same free space, so
the whole run of items of length ``L`` is placed at once: the bin class with the
smallest free space ``s >= L`` takes ``s // L`` items per bin (after the first
item it is still the tightest fit, so true BFD would keep filling it), then the
next class, then new bins. The loop runs over (length, free-space) classes,
at most ``capacity**2`` of them and in practice a few thousand, so packing takes about
as long as sorting the lengths (docs/benchmarks.md: the CPU table).
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["best_fit_decreasing", "first_fit_decreasing", "next_fit"]


def _runs_of_equal_length(sorted_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, starts, counts) of the runs in a sorted array."""
    if not len(sorted_lengths):
        return sorted_lengths, np.empty(0, np.int64), np.empty(0, np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_lengths[1:] != sorted_lengths[:-1]])
    counts = np.diff(np.r_[starts, len(sorted_lengths)])
    return sorted_lengths[starts], starts, counts


def _longest_first(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Indices ordering ``lengths`` longest first, ties in index order (radix sort when it can)."""
    key = capacity - lengths
    if capacity < 2**16:
        key = key.astype(np.uint16)
    return np.argsort(key, kind="stable")


def _split_run(count: int, per_bin: int, num_bins: int) -> np.ndarray:
    """Items given to each of the first ``num_bins`` bins when each takes up to ``per_bin``."""
    take = np.full(num_bins, per_bin, dtype=np.int64)
    take[-1] = count - per_bin * (num_bins - 1)
    return take


class _BinStack:
    """Bins that share one free-space value, kept as chunks of ids (LIFO)."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: deque[np.ndarray] = deque()
        self.size = 0

    def push(self, ids: np.ndarray) -> None:
        if len(ids):
            self.chunks.append(ids)
            self.size += len(ids)

    def pop(self, count: int) -> np.ndarray:
        taken = []
        while count:
            chunk = self.chunks.pop()
            if len(chunk) > count:
                self.chunks.append(chunk[:-count])
                chunk = chunk[-count:]
            taken.append(chunk)
            count -= len(chunk)
            self.size -= len(chunk)
        return taken[0] if len(taken) == 1 else np.concatenate(taken)


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing: each item, longest first, goes to the fullest bin it fits in.

    >>> bins, n = best_fit_decreasing(np.array([4, 3, 3, 2]), 8)
    >>> bins.tolist(), n
    ([0, 0, 1, 1], 2)
    """
    order = _longest_first(lengths, capacity)
    values, starts, counts = _runs_of_equal_length(lengths[order])
    bin_of_sorted = np.empty(len(lengths), dtype=np.int64)
    stacks = [_BinStack() for _ in range(capacity)]  # stacks[s]: open bins with s tokens free
    occupied = np.zeros(capacity, dtype=np.int64)  # occupied[s] == stacks[s].size
    num_bins = 0
    for length, pos, count in zip(values.tolist(), starts.tolist(), counts.tolist()):
        # Bins filled by this run drop below `length` free, so the candidates stay fixed.
        for space in (np.flatnonzero(occupied[length:]) + length).tolist():
            per_bin = space // length
            used = min(int(occupied[space]), -(-count // per_bin))
            last = min(per_bin, count - per_bin * (used - 1))
            ids = stacks[space].pop(used)
            occupied[space] -= used
            new_pos = _place(ids, per_bin, last, space, length, pos, bin_of_sorted, stacks, occupied)
            count -= new_pos - pos
            pos = new_pos
            if count == 0:
                break
        if count:
            per_bin = capacity // length
            used = -(-count // per_bin)
            ids = np.arange(num_bins, num_bins + used, dtype=np.int64)
            num_bins += used
            last = count - per_bin * (used - 1)
            _place(ids, per_bin, last, capacity, length, pos, bin_of_sorted, stacks, occupied)
    bin_of_item = np.empty_like(bin_of_sorted)
    bin_of_item[order] = bin_of_sorted
    return bin_of_item, num_bins


def _place(ids, per_bin, last, space, length, pos, bin_of_sorted, stacks, occupied):
    """Give ``per_bin`` items of ``length`` to each bin in ``ids`` (``last`` to the final one).

    The bins had ``space`` tokens free; they are re-filed under what they have left.
    Returns the position in the sorted items after the placed ones.
    """
    placed = per_bin * (len(ids) - 1) + last
    if last == per_bin:
        bin_of_sorted[pos : pos + placed] = np.repeat(ids, per_bin)
    else:
        bin_of_sorted[pos : pos + placed - last] = np.repeat(ids[:-1], per_bin)
        bin_of_sorted[pos + placed - last : pos + placed] = ids[-1]
    for bins, taken in ((ids[:-1], per_bin), (ids[-1:], last)):
        free = space - taken * length
        if free > 0 and len(bins):
            stacks[free].push(bins)
            occupied[free] += len(bins)
    return pos + placed


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """First-fit decreasing: each item, longest first, goes to the oldest bin it fits in.

    Runs of equal length are placed at once (the first bin that fits keeps
    taking items while it can), vectorised over the open bins.

    >>> bins, n = first_fit_decreasing(np.array([5, 4, 3, 2, 2]), 8)
    >>> bins.tolist(), n
    ([0, 1, 0, 1, 1], 2)
    """
    order = _longest_first(lengths, capacity)
    values, starts, counts = _runs_of_equal_length(lengths[order])
    bin_of_sorted = np.empty(len(lengths), dtype=np.int64)
    free = np.empty(0, dtype=np.int64)  # free tokens of every bin, in opening order
    smallest = int(values[-1]) if len(values) else 1
    open_ids = np.empty(0, dtype=np.int64)  # bins that can still take the smallest item
    for length, start, count in zip(values.tolist(), starts.tolist(), counts.tolist()):
        fits = open_ids[free[open_ids] >= length]
        per_bin = free[fits] // length
        filled = np.cumsum(per_bin)
        used = int(np.searchsorted(filled, count)) + 1 if len(fits) else 0
        if used > len(fits) or used == 0:
            take = per_bin
        else:
            take = per_bin[:used].copy()
            take[-1] -= filled[used - 1] - count
        fits = fits[: len(take)]
        placed = int(take.sum())
        bin_of_sorted[start : start + placed] = np.repeat(fits, take)
        free[fits] -= take * length
        rest = count - placed
        if rest:
            per_new = capacity // length
            new = -(-rest // per_new)
            ids = np.arange(len(free), len(free) + new, dtype=np.int64)
            take_new = _split_run(rest, per_new, new)
            bin_of_sorted[start + placed : start + count] = np.repeat(ids, take_new)
            free = np.r_[free, capacity - take_new * length]
            open_ids = np.r_[open_ids, ids]
        open_ids = open_ids[free[open_ids] >= smallest]
    bin_of_item = np.empty_like(bin_of_sorted)
    bin_of_item[order] = bin_of_sorted
    return bin_of_item, len(free)


def next_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """Next-fit in the given order: a bin is closed when the next item does not fit.

    >>> bins, n = next_fit(np.array([3, 2, 4, 3]), 8)
    >>> bins.tolist(), n
    ([0, 0, 1, 1], 2)
    """
    from bisect import bisect_right

    ends = np.cumsum(lengths)
    ends_list = ends.tolist()
    row_starts = []
    first, base, n = 0, 0, len(ends_list)
    while first < n:
        row_starts.append(first)
        # every item has >= 1 token, so a row ends within `capacity` items
        first = bisect_right(ends_list, base + capacity, first + 1, min(n, first + capacity))
        base = ends_list[first - 1]
    bin_of_item = np.zeros(len(lengths), dtype=np.int64)
    if row_starts:
        bin_of_item[row_starts[1:]] = 1
        bin_of_item = np.cumsum(bin_of_item)
    return bin_of_item, len(row_starts)
