"""A collator that pads every row to a bucket, for compiled training (``PackingTrainer`` compiling its layers).

    compile_buckets(budget)      one bucket: the token budget (rounded up to 8), which multipack micro-batches nearly fill
    bucketed_collator(c, b)      a FlatteningCollator without buckets gets them; other collators stay as they are
    plan_padding(sampler, b)     the pad slots the buckets add over a sampler's epoch plan
    bucket_padding_id(c)         the token of the padding segment a bucketed collator appends (what counts padding)

The padding is a segment of its own (``FlatteningCollator(pad_to_buckets=...)``): never trained, counted as padding
by ``packing_collators.batch.padding_tail``.
"""

from __future__ import annotations

__all__ = ["bucket_padding_id", "bucketed_collator", "compile_buckets", "plan_padding"]


def bucketed_collator(collator, buckets: tuple[int, ...]):
    """``collator`` padding to ``buckets``: a FlatteningCollator without buckets gets them; others stay.

    >>> from packing_collators import FlatteningCollator
    >>> bucketed_collator(FlatteningCollator(), (64,)).options.pad_to_buckets
    (64,)
    >>> bucketed_collator(FlatteningCollator(pad_to_buckets=[32]), (64,)).options.pad_to_buckets
    (32,)
    """
    from dataclasses import asdict

    from ._flattening import FlatteningCollator

    if type(collator) is not FlatteningCollator or collator.options.pad_to_buckets is not None:
        return collator
    return FlatteningCollator(**{**asdict(collator.options), "pad_to_buckets": buckets})


def compile_buckets(budget: int) -> tuple[int, ...]:
    """PackingTrainer's buckets for a token budget: one, the budget (rounded up to 8), which multipack
    micro-batches nearly fill; the last micro-batches of an epoch pay more.

    >>> compile_buckets(16384)
    (16384,)
    >>> compile_buckets(1001)
    (1008,)
    """
    from ._buckets import length_buckets

    return length_buckets(budget, count=1, multiple=8)


def plan_padding(sampler, buckets: tuple[int, ...]) -> float | None:
    """Pad slots / all slots the buckets add over ``sampler``'s epoch plan (None: a sampler without a plan)."""
    from ._buckets import bucket_padding_fraction

    plan = getattr(sampler, "plan", None)
    tokens = getattr(plan(), "row_tokens", None) if callable(plan) else None
    return None if tokens is None else bucket_padding_fraction(tokens, buckets)


def bucket_padding_id(collator) -> int | None:
    """The token of the padding segment ``collator`` appends to reach a bucket, or None where it pads to none.

    >>> from packing_collators import FlatteningCollator
    >>> bucket_padding_id(FlatteningCollator(pad_to_buckets=[64])), bucket_padding_id(FlatteningCollator())
    (0, None)
    """
    options = getattr(collator, "options", None)
    return options.pad_token_id if getattr(options, "pad_to_buckets", None) else None
