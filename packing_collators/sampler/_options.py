"""The sampler's settings, written once: one frozen object, checked once, when it is built.

``MultipackBatchSampler(lengths, 8, balance="tokens")`` and ``plan_epoch(lengths, 8, ...)``
both turn their keyword arguments into one :class:`SamplerOptions`, and the epoch planning
reads that object::

    MultipackBatchSampler(lengths, 8, seed=3)   ->  SamplerOptions(max_tokens_per_batch=8, seed=3, ...)
    plan_epoch(lengths, 8, seed=3)              ->  SamplerOptions(max_tokens_per_batch=8, seed=3, ...)
                                                       |  checked in __post_init__, then read-only
                                                       v
                                                plan_with_options(lengths, options, epoch=...)

Each field has one check (:func:`check_sampler_option`), which ``PackingTrainer`` runs too
on the options it hands the sampler (``strategy``, ``attention_weight``, ``overflow``: the
sampler's names), so a bad value raises the same words wherever it is given, when it is given.

Cost: a few comparisons per field at construction; nothing per epoch or per batch.
No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

from .._progress import validate_progress
from .._validation import validate_attention_weight, validate_choice, validate_positive_int
from ..engine import Overflow, Strategy

__all__ = ["SAMPLER_OVERFLOW", "Balance", "SamplerOptions", "check_sampler_option"]

Balance = Literal["cost", "tokens", "attention", "none"]
SAMPLER_OVERFLOW: tuple[str, ...] = ("error", "drop")
"""The ``Overflow`` values a sampler honours: it picks whole examples, so it cannot truncate or split one."""


def _choice(literal) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        validate_choice(name, value, literal)
        return value

    return check


def _optional_positive_int(name: str, value: Any) -> int | None:
    return None if value is None else validate_positive_int(name, value)


# field -> check(name the caller's user wrote, value) -> the value normalised, or the error naming it
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "max_tokens_per_batch": validate_positive_int,
    "seed": lambda name, value: validate_positive_int(name, value, minimum=0),
    "strategy": _choice(Strategy),
    "shuffle": lambda name, value: bool(value),
    "drop_last": lambda name, value: bool(value),
    "group_size": _optional_positive_int,
    "balance": _choice(Balance),
    "attention_weight": lambda name, value: validate_attention_weight(value),
    "overflow": _choice(SAMPLER_OVERFLOW),
    "num_replicas": validate_positive_int,
    "progress": lambda name, value: validate_progress(value),
}


def check_sampler_option(field: str, value: Any) -> Any:
    """``value`` of :class:`SamplerOptions`' ``field``, checked and normalised, or the error naming it.

    The one check of each sampler setting: :class:`SamplerOptions` runs it on every field,
    and ``PackingTrainer`` on the ones it hands the sampler.

    >>> check_sampler_option("seed", 3), check_sampler_option("shuffle", 0)
    (3, False)
    >>> check_sampler_option("strategy", "best")
    Traceback (most recent call last):
    ...
    ValueError: strategy='best' is not supported; choose one of 'bfd', 'ffd', 'next_fit'.
    """
    return _CHECKS[field](field, value)


@dataclass(frozen=True, kw_only=True)
class SamplerOptions:
    """How :class:`MultipackBatchSampler` and :func:`plan_epoch` plan each epoch (the arguments they document).

    Keyword-only, frozen and checked when built (a bad value raises here, naming it, not at the
    first epoch); ``dataclasses.replace`` builds a changed copy, checked again. Every field but
    ``num_replicas`` (the ranks it is planned for) and ``progress`` (which changes nothing in the
    plan) is in the fingerprint the ranks compare (``_rank_agreement.py``).

    Fields:
        max_tokens_per_batch: the most tokens a batch may hold (required).
        seed, strategy, shuffle, drop_last, group_size, balance, attention_weight, overflow,
            num_replicas, progress: as :class:`MultipackBatchSampler`'s arguments of those names
            (``num_replicas`` resolved: 1 by default, never ``None``).

    >>> from dataclasses import replace
    >>> options = SamplerOptions(max_tokens_per_batch=8, balance="tokens")
    >>> options.balance, options.seed, options.num_replicas
    ('tokens', 0, 1)
    >>> replace(options, seed=3).seed
    3
    >>> options.seed = 3
    Traceback (most recent call last):
    ...
    dataclasses.FrozenInstanceError: cannot assign to field 'seed'
    >>> replace(options, balance="flops")
    Traceback (most recent call last):
    ...
    ValueError: balance='flops' is not supported; choose one of 'cost', 'tokens', 'attention', 'none'.
    """

    max_tokens_per_batch: int
    seed: int = 0
    strategy: Strategy = "bfd"
    shuffle: bool = True
    drop_last: bool = False
    group_size: int | None = None
    balance: Balance = "cost"
    attention_weight: float | None = None
    overflow: Overflow = "error"
    num_replicas: int = 1
    progress: bool | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, check_sampler_option(field.name, getattr(self, field.name)))
