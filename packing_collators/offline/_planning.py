"""The global plan of a packing, from the example lengths and the options alone.

Lengths in, a :class:`RowPlan` and the :class:`PackStats` of the whole packing out::

    lengths  [5, 2, 4, 3]   --engine (bfd), pieces (split) or wrapping-->   rows  [[0, 3], [1, 2]]
             --seeded shuffle of the rows-->  [[1, 2], [0, 3]]  --shard i of N-->  rows [i*R//N, (i+1)*R//N)

Nothing here reads a token, so every machine of a sharded build computes the same plan
(same lengths, same seed) and keeps its own contiguous range of the final row order;
the shards, concatenated in order, are the one-machine packing row for row.
Cost: the engine's sort over lengths (a few seconds for 10M examples) and O(examples) numpy.
"""

from __future__ import annotations

import numpy as np

from .._validation import check_not_too_long
from ..engine import PackStats, pack_lengths
from ._options import SPLIT_FIX, PackOptions
from ._row_plan import RowPlan, bin_plan, shard_bounds, split_pieces, wrapped_plan

__all__ = ["plan_rows"]


def _wrapped(lengths: np.ndarray, options: PackOptions, rng: np.random.Generator) -> tuple[RowPlan, PackStats]:
    order = rng.permutation(len(lengths)) if options.shuffle_rows else np.arange(len(lengths))
    plan = wrapped_plan(lengths, options.max_length, order)
    stats = PackStats(
        strategy="wrapped",
        capacity=options.max_length,
        examples=len(lengths),
        rows=plan.num_rows,
        packed_examples=int(np.count_nonzero(lengths)),
        input_tokens=int(lengths.sum()),
        packed_tokens=plan.total_tokens,
        empty_examples=int((lengths == 0).sum()),
        split_examples=int((np.bincount(plan.example, minlength=len(lengths)) > 1).sum()),
    )
    return plan, stats


def _bins(lengths: np.ndarray, options: PackOptions, rng: np.random.Generator) -> tuple[RowPlan, PackStats]:
    capacity = options.max_length
    if options.overflow == "error":  # named as the user named it: max_length, not the engine's capacity
        check_not_too_long(lengths, capacity, limit_name="max_length", fix=SPLIT_FIX)
    if options.overflow != "split":
        result = pack_lengths(lengths, capacity, strategy=options.strategy, overflow=options.overflow)
        plan = bin_plan(result, rng.permutation(result.num_rows) if options.shuffle_rows else None)
        return plan, PackStats.from_result(result)
    pieces = split_pieces(lengths, capacity)
    result = pack_lengths(pieces.lengths, capacity, strategy=options.strategy)
    plan = bin_plan(result, rng.permutation(result.num_rows) if options.shuffle_rows else None, pieces)
    stats = PackStats.from_result(result)
    stats.examples = len(lengths)
    stats.packed_examples = int(np.count_nonzero(lengths))
    stats.empty_examples = len(lengths) - stats.packed_examples
    stats.split_examples = pieces.split_examples
    return plan, stats


def plan_rows(lengths: np.ndarray, options: PackOptions) -> tuple[RowPlan, PackStats]:
    """The plan of this machine's rows (its shard, or all of them) and the statistics of the whole packing.

    >>> plan, stats = plan_rows(np.array([5, 2, 4, 3]), PackOptions(max_length=8, shuffle_rows=False))
    >>> plan.example.tolist(), plan.row_offsets.tolist(), stats.rows
    ([0, 3, 1, 2], [0, 2, 4], 2)
    >>> plan, stats = plan_rows(np.array([5, 2, 4, 3]), PackOptions(max_length=8, shuffle_rows=False,
    ...                                                              num_shards=2, shard_index=1))
    >>> plan.example.tolist(), plan.num_rows, stats.rows
    ([1, 2], 1, 2)
    >>> plan, stats = plan_rows(np.array([10, 3]), PackOptions(max_length=4, overflow="split", shuffle_rows=False))
    >>> plan.skip.tolist(), plan.length.tolist(), stats.split_examples, stats.packed_tokens
    ([0, 4, 0, 8], [4, 4, 3, 2], 1, 13)
    """
    rng = np.random.default_rng(options.seed)
    plan, stats = (_wrapped if options.strategy == "wrapped" else _bins)(lengths, options, rng)
    if options.num_shards > 1:
        plan = plan.rows(*shard_bounds(plan.num_rows, options.num_shards, options.shard_index))
    return plan, stats
