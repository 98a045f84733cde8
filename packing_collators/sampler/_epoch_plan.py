"""One epoch of token-budget batches for every rank: shuffle, pack, pad or drop, balance.

The plan for ``R`` ranks is a grid of ``S`` steps x ``R`` batches; batch ``(s, r)`` is what
rank ``r`` trains on at step ``s``. Lengths ``[5, 2, 4, 1, 3, 6]``, a budget of 8 tokens,
2 ranks, no shuffling (``S4`` is a token of example 4)::

    step 0:  rank 0  [1, 5]   S1 S1 S5 S5 S5 S5 S5 S5    8/8
             rank 1  [0, 4]   S0 S0 S0 S0 S0 S4 S4 S4    8/8
    step 1:  rank 0  [2, 3]   S2 S2 S2 S2 S3 -- -- --    5/8
             rank 1  [0, 1]   S0 S0 S0 S0 S0 S1 S1 --    7/8   repeated, to pad the last round

Each epoch (``seed`` and ``epoch`` seed one generator, so every process computes the same
plan without talking to the others):

1. drop zero-length examples (counted) and those over the budget (``overflow="drop"``,
   counted; ``"error"`` names the first one);
2. shuffle the example indices and cut them into groups of ``group_size`` (default: one group);
3. pack each group into bins of at most ``max_tokens_per_batch`` tokens with the engine
   (:func:`pack_lengths`, best-fit decreasing by default);
4. make the number of bins a multiple of ``R``: ``drop_last=False`` adds bins of examples
   repeated from the start of the epoch (never an empty batch), ``drop_last=True`` drops the
   bins with the fewest tokens; both are counted;
5. balance: sort the bins by cost, cut them into steps of ``R`` (so the bins in a step cost
   about the same), give each step's costliest bin to the rank with the least cost so far,
   and so on (so every rank's total is about the same too), then shuffle the steps.

Cost model: ``cost = tokens + attention_weight * sum(length**2)``, i.e. the linear layers
(tokens) plus attention (sum of squared example lengths). ``attention_weight`` is the time
of attention per squared token relative to the time per token (``per_attention / per_token``
of :func:`fit_attention_weight`, fitted from measured batches when this default mispredicts);
the default ``None`` is ``1 / max_tokens_per_batch``, so one example filling the whole budget
costs twice what the same tokens in short examples cost.

Cost: numpy over the examples and one engine packing per group (the engine loops over length
classes), most of the time the packing itself; timed, with the budget's fill and the ranks'
imbalance, by ``benchmarks/cpu/bench_sampler.py`` (docs/benchmarks.md: the CPU table).
An epoch of 4,000,000 usable examples or more shows a progress bar (``progress=None``;
``_progress.py`` says when bars are off): it moves per packed group, not per example.
Pure numpy; no torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._progress import progress_bar, show_progress
from .._ranges import ranges
from .._validation import check_not_too_long, validate_lengths, validate_positive_int
from ..engine import Overflow, Segments, Strategy, pack_lengths
from ._options import Balance, SamplerOptions

__all__ = ["EpochPlan", "check_overflow", "plan_epoch", "plan_with_options"]

_EMPTY = np.empty(0, np.int64)
PROGRESS_MIN_EXAMPLES = 4_000_000  # where planning starts to take seconds


@dataclass(frozen=True, eq=False)
class EpochPlan(Segments):
    """The batches of one epoch for every rank: the engine's :class:`Segments`, one row per batch, step after step.

    Batch ``b`` (step ``b // num_replicas``, rank ``b % num_replicas``) is row ``b``: it holds
    the dataset indices ``example[row_offsets[b]:row_offsets[b + 1]]`` and ``row_tokens[b]``
    tokens, at most ``capacity`` (the ``max_tokens_per_batch`` it was planned for); every
    ``skip`` is 0: batches hold whole examples.

    Attributes (besides those of :class:`Segments`):
        num_replicas: ranks the epoch is split over.
        batch_attention: int64 (num_rows,) sum of squared example lengths of each batch.
        stats_base: the counts behind :meth:`stats` (examples, dropped, repeated, ...).
        attention_weight: the cost model's weight of attention (``None``: ``1 / capacity``).

    >>> plan = plan_epoch([5, 2, 4, 1, 3, 6], 8, num_replicas=2, shuffle=False)
    >>> plan.batches(rank=0), plan.batches(rank=1)
    ([[1, 5], [2, 3]], [[0, 4], [0, 1]])
    >>> plan.num_steps, plan.row_tokens.tolist()
    (2, [8, 8, 5, 7])
    """

    num_replicas: int
    batch_attention: np.ndarray
    stats_base: dict
    attention_weight: float | None = None

    @property
    def num_steps(self) -> int:
        """Batches each rank gets (the same on every rank)."""
        return self.num_rows // self.num_replicas

    def batch(self, step: int, rank: int) -> list[int]:
        """The dataset indices rank ``rank`` trains on at step ``step``."""
        return self.row(step * self.num_replicas + rank)

    def batches(self, rank: int) -> list[list[int]]:
        """All of ``rank``'s batches, in order."""
        return [self.batch(step, rank) for step in range(self.num_steps)]

    def batch_cost(self) -> np.ndarray:
        """float64 (num_rows,) each batch's cost: ``tokens + attention_weight * attention``."""
        return bin_cost(self.row_tokens, self.batch_attention, self.capacity, self.attention_weight)

    def rank_costs(self) -> dict[str, np.ndarray]:
        """float64 (num_replicas,) total tokens, attention and cost of each rank's batches."""
        tokens = self.row_tokens.reshape(-1, self.num_replicas)
        attention = self.batch_attention.reshape(-1, self.num_replicas).astype(np.float64)
        cost = self.batch_cost().reshape(-1, self.num_replicas)
        return {"tokens": tokens.sum(0).astype(np.float64), "attention": attention.sum(0), "cost": cost.sum(0)}

    def stats(self) -> dict:
        """Statistics of the epoch as a plain dict (for logging or JSON).

        ``efficiency`` and ``lower_bound_batches`` are the engine's measures of these rows
        (:class:`RowMeasures`): tokens / (batches * budget), over all ranks' batches; the
        ``imbalance*`` values are max over ranks of a rank's epoch total / the mean - 1
        (by the cost model, by tokens, by attention); ``step_imbalance`` is the cost
        lost to waiting at each step: sum over steps of the slowest rank's cost / sum of
        the mean cost - 1. ``attention_weight`` is the cost model's weight (the default
        resolved to ``1 / max_tokens_per_batch``). ``overflow_dropped_*`` count the examples over
        the budget that ``overflow="drop"`` left out, ``drop_last_*`` those in the bins
        ``drop_last=True`` dropped.

        >>> stats = plan_epoch([5, 2, 4, 1, 3, 6], 8, num_replicas=2, shuffle=False).stats()
        >>> stats["batches_per_epoch"], stats["padded_batches"], stats["repeated_examples"]
        (2, 1, 2)
        >>> round(stats["efficiency"], 4), round(stats["imbalance_tokens"], 4)
        (0.875, 0.0714)
        """
        total = self.num_rows
        costs = self.rank_costs()
        stats = dict(
            max_tokens_per_batch=self.capacity,
            num_replicas=self.num_replicas,
            batches_per_epoch=self.num_steps,
            total_batches=total,
            tokens=self.total_tokens,
            lower_bound_batches=self.lower_bound_rows,
            efficiency=self.efficiency,
            attention_weight=1 / self.capacity if self.attention_weight is None else self.attention_weight,
        )
        stats.update(self.stats_base)
        for name in ("cost", "tokens", "attention"):
            key = "imbalance" if name == "cost" else f"imbalance_{name}"
            stats[key] = _imbalance(costs[name])
        step_cost = self.batch_cost().reshape(-1, self.num_replicas)
        mean = step_cost.mean(1).sum() if total else 0.0
        stats["step_imbalance"] = float(step_cost.max(1).sum() / mean - 1) if mean else 0.0
        return stats


def bin_cost(tokens: np.ndarray, attention: np.ndarray, budget: int, attention_weight: float | None) -> np.ndarray:
    """float64 ``tokens + attention_weight * attention``; ``None`` divides by ``budget`` (the default, bit for bit).

    >>> bin_cost(np.array([8, 8]), np.array([64, 16]), 8, None).tolist(), bin_cost(np.array([8]), np.array([64]), 8, 0.0).tolist()
    ([16.0, 10.0], [8.0])
    """
    attention = np.asarray(attention, np.float64)
    return tokens + (attention / budget if attention_weight is None else attention * attention_weight)


def _imbalance(per_rank: np.ndarray) -> float:
    """max / mean - 1 (0.0 when nothing is planned)."""
    mean = per_rank.mean() if len(per_rank) else 0.0
    return float(per_rank.max() / mean - 1) if mean else 0.0


def check_overflow(lengths: np.ndarray, budget: int, overflow: str) -> np.ndarray:
    """Boolean (n,) mask of examples over the budget, or the error naming the first one."""
    if overflow == "error":
        check_not_too_long(
            lengths,
            budget,
            limit_name="max_tokens_per_batch",
            fix="Raise max_tokens_per_batch, truncate the dataset to it when tokenizing, "
            "or pass overflow='drop' to leave such examples out (counted in stats).",
        )
    return lengths > budget


def _pack_groups(order: np.ndarray, lengths: np.ndarray, budget: int, strategy: str, group_size: int | None, bar):
    """Bins (CSR: indices, counts) packing each group of ``order`` on its own; ``bar`` moves a group at a time."""
    num_groups = 1 if group_size is None else max(1, len(order) // group_size)
    parts, counts = [], []
    for group in np.array_split(order, num_groups) if num_groups > 1 else [order]:
        result = pack_lengths(lengths[group], budget, strategy=strategy)
        parts.append(group[result.example])
        counts.append(np.diff(result.row_offsets))
        bar.update(len(group))
    return np.concatenate(parts), np.concatenate(counts)


def _repeat_bins(order: np.ndarray, lengths: np.ndarray, budget: int, count: int):
    """``count`` bins of examples repeated from the start of ``order`` (next-fit, each full)."""
    cumulative = np.cumsum(lengths[order])
    prefix = order[: int(np.searchsorted(cumulative, count * budget)) + 1]
    result = pack_lengths(lengths[prefix], budget, strategy="next_fit")
    rows = np.arange(count) % result.num_rows  # tiny epochs: cycle over what there is
    starts, ends = result.row_offsets[rows], result.row_offsets[rows + 1]
    return prefix[result.example[_ranges(starts, ends)]], ends - starts


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, e)`` for each pair, without a Python loop."""
    return ranges(starts, ends - starts)


def _deal(cost: np.ndarray, num_replicas: int, balance: str) -> np.ndarray:
    """Bin order (steps x ranks, flattened): ``num_replicas`` bins per step, by cost, descending.

    Each step's bins go largest first to the ranks with the least cost so far (LPT in
    rounds): a loop over steps, not bins, of two tiny numpy calls each.
    """
    if balance == "none" or num_replicas == 1:
        return np.arange(len(cost))
    grid = np.argsort(-cost, kind="stable").reshape(-1, num_replicas)
    dealt = np.empty_like(grid)
    load = np.zeros(num_replicas)
    for step, bins in enumerate(grid):
        ranks = np.argsort(load, kind="stable")  # least loaded first
        dealt[step, ranks] = bins
        load[ranks] += cost[bins]
    return dealt.ravel()


def _stats_base(lengths: np.ndarray, too_long: np.ndarray, overflow: str) -> dict:
    """The counts behind :meth:`EpochPlan.stats` before padding or dropping bins (those start at 0)."""
    dropped = overflow == "drop"
    return {
        "examples": len(lengths),
        "empty_examples": int((lengths == 0).sum()),
        "overflow_dropped_examples": int(too_long.sum()) if dropped else 0,
        "overflow_dropped_tokens": int(lengths[too_long].sum()) if dropped else 0,
        "padded_batches": 0,
        "repeated_examples": 0,
        "repeated_tokens": 0,
        "drop_last_examples": 0,
        "drop_last_tokens": 0,
    }


def _balanced_plan(
    lengths: np.ndarray,
    too_long: np.ndarray,
    order: np.ndarray,
    indices: np.ndarray,
    counts: np.ndarray,
    rng: np.random.Generator,
    options: SamplerOptions,
) -> EpochPlan:
    """Steps 4 and 5 of the module docstring: the packed bins (CSR) padded or dropped to a multiple
    of ``num_replicas``, dealt to ranks by cost, the steps shuffled."""
    budget, num_replicas, balance = options.max_tokens_per_batch, options.num_replicas, options.balance
    bins = rng.permutation(len(counts)) if options.shuffle else np.arange(len(counts))
    base = _stats_base(lengths, too_long, options.overflow)
    extra = -len(counts) % num_replicas
    if extra and not options.drop_last:
        more, more_counts = _repeat_bins(order, lengths, budget, extra)
        bins = np.r_[bins, np.arange(len(counts), len(counts) + extra)]
        indices, counts = np.r_[indices, more], np.r_[counts, more_counts]
        base.update(padded_batches=extra, repeated_examples=len(more), repeated_tokens=int(lengths[more].sum()))
    offsets = np.r_[0, np.cumsum(counts)]
    example_tokens = lengths[indices]
    tokens = np.add.reduceat(example_tokens, offsets[:-1]) if len(counts) else _EMPTY
    attention = np.add.reduceat(example_tokens**2, offsets[:-1]) if len(counts) else _EMPTY
    if extra and options.drop_last:  # drop the bins with the fewest tokens
        dropped = np.argsort(tokens[bins], kind="stable")[: len(bins) % num_replicas]
        base.update(
            drop_last_examples=int(counts[bins[dropped]].sum()), drop_last_tokens=int(tokens[bins[dropped]].sum())
        )
        bins = np.delete(bins, dropped)
    by = {"tokens": tokens, "attention": attention}
    cost = by[balance] if balance in by else bin_cost(tokens, attention, budget, options.attention_weight)
    dealt = _deal(cost[bins].astype(np.float64), num_replicas, balance)
    if options.shuffle and balance != "none":
        steps = rng.permutation(len(dealt) // num_replicas)
        dealt = dealt.reshape(-1, num_replicas)[steps].ravel()
    chosen = bins[dealt]
    entries = _ranges(offsets[chosen], offsets[chosen + 1])
    return EpochPlan(
        capacity=budget,
        example=indices[entries],
        skip=np.zeros(len(entries), np.int64),
        length=example_tokens[entries],
        row_offsets=np.r_[0, np.cumsum(counts[chosen])].astype(np.int64),
        num_replicas=num_replicas,
        batch_attention=attention[chosen],
        stats_base=base,
        attention_weight=options.attention_weight,
    )


def plan_epoch(
    lengths: Sequence[int] | np.ndarray,
    max_tokens_per_batch: int,
    *,
    num_replicas: int = 1,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    strategy: Strategy = "bfd",
    group_size: int | None = None,
    balance: Balance = "cost",
    attention_weight: float | None = None,
    drop_last: bool = False,
    overflow: Overflow = "error",
    progress: bool | None = None,
) -> EpochPlan:
    """Plan one epoch of token-budget batches for ``num_replicas`` ranks (the module docstring says how).

    Args: as :class:`MultipackBatchSampler`, plus ``epoch``; they are checked as one
    :class:`SamplerOptions`. The same arguments give the same plan in every process;
    ``progress`` (a bar on stderr; ``None``: for 4,000,000+ examples, unless ``datasets`` or
    ``transformers`` has progress bars off) changes nothing in it.

    >>> plan = plan_epoch([3, 5, 2, 8, 1, 4, 7, 2], 8, num_replicas=2, seed=0)
    >>> plan.batches(rank=0), plan.batches(rank=1)
    ([[3], [2, 5, 7]], [[4, 6], [0, 1]])
    >>> plan_epoch([3, 9], 8)
    Traceback (most recent call last):
    ...
    ValueError: Example 1 has 9 tokens, more than max_tokens_per_batch=8 (1 example(s) too long, the longest 9 tokens). Raise max_tokens_per_batch, truncate the dataset to it when tokenizing, or pass overflow='drop' to leave such examples out (counted in stats).
    """
    options = SamplerOptions(
        max_tokens_per_batch=max_tokens_per_batch, seed=seed, strategy=strategy, shuffle=shuffle,
        drop_last=drop_last, group_size=group_size, balance=balance, attention_weight=attention_weight,
        overflow=overflow, num_replicas=num_replicas, progress=progress,
    )  # fmt: skip
    return plan_with_options(validate_lengths(lengths), options, epoch=validate_positive_int("epoch", epoch, minimum=0))


def plan_with_options(lengths: np.ndarray, options: SamplerOptions, *, epoch: int = 0, rank: int = 0) -> EpochPlan:
    """:func:`plan_epoch` of lengths already checked (int64, by :func:`validate_lengths`) and checked options.

    ``rank`` is the process that plans (the plan is every rank's, the same on each): with
    ``progress=None`` only rank 0 may show a bar.

    >>> plan_with_options(np.array([3, 5, 2, 8]), SamplerOptions(max_tokens_per_batch=8, shuffle=False)).batches(rank=0)
    [[3], [0, 1], [2]]
    """
    budget = options.max_tokens_per_batch
    too_long = check_overflow(lengths, budget, options.overflow)
    usable = np.flatnonzero((lengths > 0) & ~too_long)
    progress = False if options.progress is None and rank else options.progress  # one bar: rank 0's
    show = show_progress(progress, len(usable), PROGRESS_MIN_EXAMPLES)
    with progress_bar(show, total=len(usable), desc=f"planning epoch {epoch}", unit="example") as bar:
        rng = np.random.default_rng([options.seed, epoch])
        order = rng.permutation(usable) if options.shuffle else usable
        bar.set_postfix_str("packing")
        indices, counts = _pack_groups(order, lengths, budget, options.strategy, options.group_size, bar)
        bar.set_postfix_str("balancing")
        return _balanced_plan(lengths, too_long, order, indices, counts, rng, options)
