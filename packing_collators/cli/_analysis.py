"""The numbers behind ``packing-collators analyze``: how a dataset's lengths pad, and how they pack.

For lengths ``L`` (cut to ``max_length = C``), batches of ``B`` examples and a token budget ``T``::

    padded tokens   sum over batches of  B_b * max(L in batch)     random order, or length-grouped
    bfd/ffd/next_fit  rows of the packing engine (pack_lengths)    efficiency = tokens / (rows * C)
    wrapped         ceil(sum L / C) rows, examples split across rows (boundaries not kept)
    sampler         MultipackBatchSampler batches of at most T tokens per epoch
    speed-up        padded tokens (random order) / packed slots (rows * C, or batches * T)

"Length-grouped" is what transformers' ``group_by_length`` does: shuffle, cut into
megabatches of ``min(n // 4B, 50)`` batches, sort each megabatch by length (its swap
that puts the longest batch first is left out: it moves one example).
Zero-length examples are in no batch and no row; they are counted as ``empty_examples``.

Cost: numpy over the lengths (never over tokens), plus one engine call per strategy and
one epoch plan of the sampler, most of it ffd and the sampler (timed by
``benchmarks/cpu/bench_cli_analyze.py``).
From 1,000,000 examples on, a progress bar on stderr moves once per stage (padding, each
strategy, the sampler), unless ``datasets`` or ``transformers`` has progress bars off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .._progress import progress_bar, show_progress
from .._validation import validate_choice, validate_lengths, validate_positive_int
from ..engine import Overflow, RowMeasures, lower_bound, pack_lengths

__all__ = ["ANALYZE_OVERFLOW", "Analysis", "Packing", "Padding", "Recommendation", "analyze_lengths", "check_max_length"]

ANALYZE_OVERFLOW: tuple[str, ...] = ("truncate", "drop")
"""The ``Overflow`` values ``analyze`` takes: it measures what a training run sees, so it cuts (default) or leaves out
an example over ``max_length`` and counts it; ``"error"`` would stop at the first one (docs/cli.md)."""
ROW_STRATEGIES = ("bfd", "ffd", "next_fit")
PERCENTILES = (50, 90, 95, 99, 99.9)
WORTH_PACKING = 1.1  # below this expected speed-up, padding is recommended
STAGES = ("padding", *ROW_STRATEGIES, "wrapped", "sampler")  # what the progress bar counts
PROGRESS_MIN_EXAMPLES = 1_000_000  # where the analysis starts to take seconds


@dataclass(frozen=True)
class Padding:
    """Padded batches of ``batch_size`` examples, each padded to its longest."""

    order: str
    batch_size: int
    steps: int
    tokens: int
    padded_tokens: int

    @property
    def waste(self) -> float:
        """Fraction of the padded slots that are padding."""
        return 1 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0


@dataclass(frozen=True)
class Packing(RowMeasures):
    """One packing of the lengths: rows of ``capacity`` tokens (or the sampler's batches of a budget).

    ``steps`` is optimizer micro-steps per epoch: ``ceil(rows / batch_size)`` for rows,
    the batches for the sampler (one batch a step).
    """

    strategy: str
    capacity: int
    rows: int
    steps: int
    lower_bound: int
    tokens: int
    truncated_examples: int
    dropped_examples: int
    split_examples: int
    keeps_boundaries: bool
    speedup: float

    def _tokens_and_rows(self) -> tuple[int, int]:
        return self.tokens, self.rows


@dataclass(frozen=True)
class Recommendation:
    """What to do: whether to pack, how, with which max length and token budget, and why."""

    pack: bool
    strategy: str
    max_length: int
    max_tokens_per_batch: int
    speedup: float
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Analysis:
    """Lengths, padding waste and every packing of one dataset (see :func:`analyze_lengths`)."""

    max_length: int
    batch_size: int
    max_tokens_per_batch: int
    overflow: str
    examples: int
    tokens: int
    empty_examples: int
    longer_examples: int
    lost_tokens: int
    mean_length: float
    percentiles: dict
    padding: tuple[Padding, ...]
    packings: tuple[Packing, ...]
    recommendation: Recommendation

    def packing(self, strategy: str) -> Packing:
        """The packing of ``strategy`` (``"bfd"``, ``"ffd"``, ``"next_fit"``, ``"wrapped"`` or ``"sampler"``)."""
        return next(p for p in self.packings if p.strategy == strategy)

    def as_dict(self) -> dict:
        """Everything as plain Python values (for ``--json``), with efficiency, rows_over_lower_bound and waste included."""
        data = asdict(self)
        data["padding"] = [{**asdict(p), "waste": p.waste} for p in self.padding]
        data["packings"] = [{**asdict(p), "efficiency": p.efficiency, "rows_over_lower_bound": p.rows_over_lower_bound} for p in self.packings]
        data["recommendation"]["reasons"] = list(self.recommendation.reasons)
        return data


def check_max_length(lengths: np.ndarray, max_length: int) -> None:
    """A ValueError when every non-empty example is longer than ``max_length`` (nothing would fit whole).

    >>> check_max_length(np.array([9, 12, 0]), 8)
    Traceback (most recent call last):
    ...
    ValueError: Every example is longer than max length 8 (the shortest has 9 tokens); raise the max length (--max-length) to at least 9.
    """
    nonempty = lengths[lengths > 0]
    if len(nonempty) and int(nonempty.min()) > max_length:
        shortest = int(nonempty.min())
        raise ValueError(
            f"Every example is longer than max length {max_length} (the shortest has {shortest} tokens); "
            f"raise the max length (--max-length) to at least {shortest}."
        )


def padded_tokens(lengths: np.ndarray, batch_size: int, order: np.ndarray) -> int:
    """Slots of padded batches: ``order`` cut into batches of ``batch_size``, each padded to its longest.

    >>> padded_tokens(np.array([5, 1, 2, 8]), 2, order=np.array([0, 1, 2, 3]))
    26
    """
    if not len(order):
        return 0
    ordered = lengths[order]
    starts = np.arange(0, len(ordered), batch_size)
    sizes = np.diff(np.r_[starts, len(ordered)])
    return int((np.maximum.reduceat(ordered, starts) * sizes).sum())


def length_grouped_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """transformers' ``group_by_length`` order: shuffled megabatches, each sorted by length, longest first."""
    n = len(lengths)
    megabatch = max(1, min(n // (batch_size * 4), 50)) * batch_size
    shuffled = rng.permutation(n)
    longest = int(lengths.max(initial=0))
    key = (np.arange(n, dtype=np.int64) // megabatch) * (longest + 1) + (longest - lengths[shuffled])
    return shuffled[np.argsort(key, kind="stable")]  # by megabatch, then longest first


def _padding(lengths: np.ndarray, batch_size: int, seed: int) -> tuple[Padding, Padding]:
    rng = np.random.default_rng(seed)
    tokens, steps = int(lengths.sum()), math.ceil(len(lengths) / batch_size)
    random_order = rng.permutation(len(lengths))
    grouped_order = length_grouped_order(lengths, batch_size, rng)
    return (
        Padding("random", batch_size, steps, tokens, padded_tokens(lengths, batch_size, random_order)),
        Padding("length-grouped", batch_size, steps, tokens, padded_tokens(lengths, batch_size, grouped_order)),
    )


def _split_examples(lengths: np.ndarray, capacity: int, seed: int) -> int:
    """Examples that span two or more rows when wrapped in ``pack_dataset``'s default order (shuffled by ``seed``).

    Seed 0 puts ``[3, 5, 2]`` in the order ``[2, 0, 1]``: rows ``S2 S2 S0 S0 | S0 S1 S1 S1 | S1 S1``.

    >>> _split_examples(np.array([3, 5, 2]), 4, seed=0), _split_examples(np.array([4, 4]), 4, seed=0)
    (2, 0)
    """
    stream = lengths[np.random.default_rng(seed).permutation(len(lengths))]
    stream = stream[stream > 0]
    ends = np.cumsum(stream)
    return int(((ends - stream) // capacity != (ends - 1) // capacity).sum())


def _row_packings(lengths, max_length, batch_size, overflow, seed, padded, bar) -> list[Packing]:
    packings = []
    for strategy in ROW_STRATEGIES:
        bar.set_postfix_str(strategy)
        result = pack_lengths(lengths, max_length, strategy=strategy, overflow=overflow)
        packings.append(
            Packing(
                strategy=strategy,
                capacity=max_length,
                rows=result.num_rows,
                steps=math.ceil(result.num_rows / batch_size),
                lower_bound=result.lower_bound_rows,
                tokens=result.total_tokens,
                truncated_examples=result.num_truncated,
                dropped_examples=result.num_dropped,
                split_examples=0,
                keeps_boundaries=True,
                speedup=padded / (result.num_rows * max_length) if result.num_rows else 1.0,
            )
        )
        bar.update()
    bar.set_postfix_str("wrapped")
    tokens = int(lengths.sum())
    rows = lower_bound(tokens, max_length)
    packings.append(
        Packing(
            strategy="wrapped",
            capacity=max_length,
            rows=rows,
            steps=math.ceil(rows / batch_size),
            lower_bound=rows,
            tokens=tokens,
            truncated_examples=0,
            dropped_examples=0,
            split_examples=_split_examples(lengths, max_length, seed),
            keeps_boundaries=False,
            speedup=padded / (rows * max_length) if rows else 1.0,
        )
    )
    bar.update()
    return packings


def _sampler_packing(lengths, budget, seed, padded, *, truncated: int, dropped: int) -> Packing:
    from ..sampler import plan_epoch  # what MultipackBatchSampler plans, without importing torch

    stats = plan_epoch(lengths, budget, seed=seed, num_replicas=1, overflow="drop", progress=False).stats()
    batches = stats["batches_per_epoch"]
    return Packing(
        strategy="sampler",
        capacity=budget,
        rows=batches,
        steps=batches,
        lower_bound=stats["lower_bound_batches"],
        tokens=stats["tokens"],
        truncated_examples=truncated,
        dropped_examples=dropped + stats["overflow_dropped_examples"],
        split_examples=0,
        keeps_boundaries=True,
        speedup=padded / (batches * budget) if batches else 1.0,
    )


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def _recommend(analysis: dict, lengths: np.ndarray) -> Recommendation:
    packings = analysis["packings"]
    random_padding = analysis["padding"][0]
    best = max((p for p in packings if p.keeps_boundaries), key=lambda p: p.speedup)  # ties: bfd first
    max_length, batch_size = analysis["max_length"], analysis["batch_size"]
    reasons = []
    p999 = int(np.percentile(lengths, 99.9, method="inverted_cdf")) if len(lengths) else 0
    recommended_length = max_length
    if analysis["longer_examples"]:
        share = analysis["longer_examples"] / analysis["examples"]
        verb = "truncates" if analysis["overflow"] == "truncate" else "drops"
        reasons.append(
            f"max length {max_length:,} {verb} {analysis['longer_examples']:,} examples ({share:.2%}), "
            f"{analysis['lost_tokens']:,} tokens"
        )
        if p999 > max_length:
            recommended_length = _round_up(p999, 128)
            reasons.append(f"max length {recommended_length:,} keeps 99.9% of examples whole")
    budget = batch_size * recommended_length
    if best.speedup >= WORTH_PACKING:
        how = "MultipackBatchSampler" if best.strategy == "sampler" else f"pack_dataset(strategy={best.strategy!r})"
        reasons.append(
            f"pack: {how} fills {best.efficiency:.2%} of its slots; padding in random order wastes "
            f"{random_padding.waste:.1%}, so an epoch needs about {best.speedup:.2f}x fewer token slots"
        )
    else:
        reasons.append(
            f"padding wastes only {random_padding.waste:.1%}; packing would save under "
            f"{WORTH_PACKING - 1:.0%} of the compute"
        )
    reasons.append(
        f"token budget {budget:,} = {batch_size} x {recommended_length:,}: the memory of one padded batch "
        f"of {batch_size} examples at the max length"
    )
    wrapped = next(p for p in packings if p.strategy == "wrapped")
    if wrapped.efficiency - best.efficiency > 0.01:
        reasons.append(
            f"wrapped fills {wrapped.efficiency:.2%} but splits {wrapped.split_examples:,} examples across rows; "
            "use it only when example boundaries do not matter (pretraining-style text)"
        )
    return Recommendation(
        pack=best.speedup >= WORTH_PACKING,
        strategy=best.strategy,
        max_length=recommended_length,
        max_tokens_per_batch=budget,
        speedup=best.speedup,
        reasons=tuple(reasons),
    )


def analyze_lengths(
    lengths: Sequence[int] | np.ndarray,
    max_length: int,
    *,
    batch_size: int = 8,
    max_tokens_per_batch: int | None = None,
    overflow: Overflow = "truncate",
    seed: int = 0,
    progress: bool | None = None,
) -> Analysis:
    """Padding waste and each packing strategy's rows, efficiency and speed-up, for one dataset's lengths.

    Args:
        lengths: tokens of each example.
        max_length: tokens per packed row, and the longest a padded example may be.
        batch_size: examples per padded batch; packed rows per step.
        max_tokens_per_batch: the sampler's token budget (default ``batch_size * max_length``).
        overflow: examples longer than ``max_length``: ``"truncate"`` (default) or ``"drop"``,
            for padding and every packing alike (``"wrapped"`` splits them instead).
        seed: seed of the random orders (padding and ``"wrapped"``) and of the sampler.
        progress: a progress bar on stderr, one step per stage; ``None`` (default): for
            1,000,000+ examples, unless ``datasets`` or ``transformers`` has progress bars off.

    >>> analysis = analyze_lengths([2, 30, 3, 28, 2, 31, 4, 29] * 4, max_length=32, batch_size=4)
    >>> analysis.examples, analysis.tokens, analysis.percentiles["p50"], analysis.percentiles["max"]
    (32, 516, 4, 31)
    >>> [(p.order, p.steps, p.padded_tokens, round(p.waste, 3)) for p in analysis.padding]
    [('random', 8, 964, 0.465), ('length-grouped', 8, 740, 0.303)]
    >>> for p in analysis.packings:
    ...     print(p.strategy, p.rows, p.steps, p.lower_bound, f"{p.efficiency:.2%}", f"{p.speedup:.2f}x")
    bfd 17 5 17 94.85% 1.77x
    ffd 17 5 17 94.85% 1.77x
    next_fit 24 6 17 67.19% 1.26x
    wrapped 17 5 17 94.85% 1.77x
    sampler 5 5 5 80.62% 1.51x
    >>> analysis.recommendation.pack, analysis.recommendation.strategy
    (True, 'bfd')
    """
    validate_choice("overflow", overflow, ANALYZE_OVERFLOW)
    validate_positive_int("batch_size", batch_size)
    validate_positive_int("max_length", max_length)
    validate_positive_int("max_tokens_per_batch", max_tokens_per_batch, allow_none=True)
    lengths = validate_lengths(lengths)
    check_max_length(lengths, max_length)
    budget = batch_size * max_length if max_tokens_per_batch is None else max_tokens_per_batch
    longer = lengths > max_length
    # What a training run sees: too-long examples cut (or left out), empty ones in no batch.
    usable = np.minimum(lengths, max_length) if overflow == "truncate" else lengths[~longer]
    usable = usable[usable > 0]
    num_longer = int(longer.sum())
    show = show_progress(progress, len(lengths), PROGRESS_MIN_EXAMPLES)
    with progress_bar(show, total=len(STAGES), desc=f"analyzing {len(lengths):,} examples", unit="stage") as bar:
        bar.set_postfix_str("padding")
        padding = _padding(usable, batch_size, seed)
        padded = padding[0].padded_tokens
        bar.update()
        packings = _row_packings(lengths, max_length, batch_size, overflow, seed, padded, bar)
        bar.set_postfix_str("sampler")
        truncated, dropped = (num_longer, 0) if overflow == "truncate" else (0, num_longer)
        packings.append(_sampler_packing(usable, budget, seed, padded, truncated=truncated, dropped=dropped))
        bar.update()
    values = np.percentile(lengths, PERCENTILES, method="inverted_cdf") if len(lengths) else [0] * len(PERCENTILES)
    percentiles = {"min": int(lengths.min()) if len(lengths) else 0}
    percentiles.update({f"p{q:g}": int(v) for q, v in zip(PERCENTILES, values)})
    percentiles["max"] = int(lengths.max(initial=0))
    fields = dict(
        max_length=int(max_length),
        batch_size=int(batch_size),
        max_tokens_per_batch=int(budget),
        overflow=overflow,
        examples=len(lengths),
        tokens=int(lengths.sum()),
        empty_examples=int((lengths == 0).sum()),
        longer_examples=num_longer,
        lost_tokens=int((lengths[longer] - max_length).sum()) if overflow == "truncate" else int(lengths[longer].sum()),
        mean_length=float(lengths.mean()) if len(lengths) else 0.0,
        percentiles=percentiles,
        padding=padding,
        packings=tuple(packings),
    )
    return Analysis(**fields, recommendation=_recommend(fields, lengths))
