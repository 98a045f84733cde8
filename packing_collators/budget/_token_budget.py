"""A micro-batch token budget from peak memory measured at a few sizes: the line and the fit (no torch).

Under a varlen kernel (flash attention, ``packing_varlen``) a packed micro-batch's memory grows
linearly with its tokens, whatever its examples' lengths: activations are per token, and
attention keeps no (T, T) matrix. Peaks measured at the longest example's length, once and
twice (``_memory_budget.py`` runs those dry runs on the GPU), draw that line::

    peak (GiB)
      |                                   .  <- memory_fraction * total - optimizer states
      |                         x  peak(2 L)
      |               x  peak(L)      |
      |        base  /                |  bytes per token = (peak(2L) - peak(L)) / L
      +--------------+---------+------+----- tokens in the micro-batch
                     L         2L     budget

    budget = min(ceiling, (memory_fraction * total - optimizer states - base) / bytes per token)

rounded down to a multiple of 64 (never below the longest example). ``base`` holds the weights,
their gradients and what a step allocates whatever its size; the optimizer's states are added
from the parameter count. The line is a first guess: :func:`fit_token_budget` measures the planned
budget itself and shrinks it until a measured size fits. ``ceiling`` bounds the budget where more
tokens would fit but would not train faster (``PackingTrainer``'s ``"auto"``: see ``_trainer_budget.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from .._validation import validate_positive_int

__all__ = ["TokenBudget", "fit_token_budget", "plan_token_budget"]

_GIB = 1 << 30
NOT_ONE = (
    "Turn on gradient checkpointing, cut long examples (max_length, overflow='truncate' or 'drop'), or use a GPU "
    "with more memory."
)


@dataclass(frozen=True)
class TokenBudget:
    """A measured token budget and the numbers behind it (bytes).

    Attributes:
        max_tokens_per_batch: the budget, at least ``longest``, a multiple of 64 unless it is ``longest``.
        longest: the longest example the budget must hold.
        base_bytes: peak memory of a step extrapolated to zero tokens (weights, gradients, workspace).
        bytes_per_token: what one more token in the micro-batch costs at the peak.
        optimizer_bytes: the optimizer states added to the measured peaks.
        total_bytes: the GPU's memory; memory_fraction: the share the budget may use.
        ceiling: the ceiling that set the budget where more tokens would fit, or None (memory set it).
    """

    max_tokens_per_batch: int
    longest: int
    base_bytes: int
    bytes_per_token: float
    optimizer_bytes: int
    total_bytes: int
    memory_fraction: float
    ceiling: int | None = None

    def summary(self) -> str:
        """One line for a log.

        >>> TokenBudget(61440, 4096, 9 << 30, 700_000.0, 2 << 30, 80 << 30, 0.9).summary()
        'token budget 61440 (longest example 4096): base 9.00 GiB + 0.67 MiB per token + optimizer states 2.00 GiB within 90% of 80.00 GiB'
        >>> TokenBudget(262144, 2048, 9 << 30, 70_000.0, 2 << 30, 80 << 30, 0.9, ceiling=262144).summary()[:60]
        'token budget 262144, its ceiling (more would fit; longest ex'
        """
        ceiling = ", its ceiling (more would fit; longest" if self.ceiling is not None else " (longest"
        return (
            f"token budget {self.max_tokens_per_batch}{ceiling} example {self.longest}): base "
            f"{self.base_bytes / _GIB:.2f} GiB + {self.bytes_per_token / (1 << 20):.2f} MiB per token + optimizer "
            f"states {self.optimizer_bytes / _GIB:.2f} GiB within {self.memory_fraction:.0%} of "
            f"{self.total_bytes / _GIB:.2f} GiB"
        )


def plan_token_budget(
    peaks: dict[int, int], *, longest: int, total_bytes: int, optimizer_bytes: int = 0, memory_fraction: float = 0.9
) -> TokenBudget:
    """The budget from peak memory measured at two token counts (``{tokens: peak bytes}``).

    >>> plan_token_budget({4096: 12 << 30, 8192: 15 << 30}, longest=4096, total_bytes=80 << 30).summary()
    'token budget 86016 (longest example 4096): base 9.00 GiB + 0.75 MiB per token + optimizer states 0.00 GiB within 90% of 80.00 GiB'
    >>> plan_token_budget({4096: 74 << 30, 8192: 78 << 30}, longest=4096, total_bytes=80 << 30)
    Traceback (most recent call last):
    ...
    ValueError: One example of 4096 tokens does not fit in 90% of this GPU's 80.00 GiB: a micro-batch of it alone peaks at 74.00 GiB (base 70.00 GiB + 1.00 MiB per token) plus 0.00 GiB of optimizer states. Turn on gradient checkpointing, cut long examples (max_length, overflow='truncate' or 'drop'), or use a GPU with more memory.
    """
    validate_positive_int("longest", longest)
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}.")
    (small, peak_small), (large, peak_large) = sorted(peaks.items())[:2]
    per_token = max(0.0, (peak_large - peak_small) / (large - small))
    base = int(peak_small - per_token * small)
    room = memory_fraction * total_bytes - optimizer_bytes - base
    fits = int(room / per_token) if per_token else large
    budget = max(longest, fits // 64 * 64)  # a multiple of 64, unless that would cut the longest example
    result = TokenBudget(budget, longest, base, per_token, optimizer_bytes, total_bytes, memory_fraction)
    if fits < longest:
        raise ValueError(
            f"One example of {longest} tokens does not fit in {memory_fraction:.0%} of this GPU's "
            f"{total_bytes / _GIB:.2f} GiB: a micro-batch of it alone peaks at {peak_small / _GIB:.2f} GiB (base "
            f"{base / _GIB:.2f} GiB + {per_token / (1 << 20):.2f} MiB per token) plus {optimizer_bytes / _GIB:.2f} GiB "
            f"of optimizer states. {NOT_ONE}"
        )
    return result


def fit_token_budget(
    measure: Callable[[int], int | None],
    *,
    longest: int,
    total_bytes: int,
    optimizer_bytes: int = 0,
    memory_fraction: float = 0.9,
    checks: int = 8,
    ceiling: int | None = None,
) -> TokenBudget:
    """The budget from ``measure(tokens)`` (peak bytes of a step of that many tokens; None: out of memory).

    It measures ``longest`` and ``2 * longest`` tokens, draws the line, then measures the planned
    budget itself: where the real peak lies above the line (gradient checkpointing's recompute,
    the allocator), the line is redrawn through the new point and the budget shrinks, until a
    measured step fits. A step that runs out of memory tells nothing of the slope, so the sizes
    that fit and failed are searched between (geometric steps while they lie over 16x apart,
    halves after) until they are within 1/16 of each other, ``checks`` measurements at most. The
    budget is always a size that was measured to fit. ``ceiling`` (tokens, None: none) bounds it
    where more would fit: no size above it (rounded down to 64, at least ``longest``) is measured.

    >>> oom_above = lambda tokens: None if tokens > 100_000 else int(1e9 + 1e4 * tokens)  # the line says ~7.6M
    >>> fit_token_budget(oom_above, longest=2048, total_bytes=80 << 30).max_tokens_per_batch
    97088

    >>> curve = lambda tokens: int(2e9 + 1e5 * tokens + 2e-2 * tokens**2)  # above any line through small sizes
    >>> plan_token_budget({4096: curve(4096), 8192: curve(8192)}, longest=4096, total_bytes=80 << 30).max_tokens_per_batch
    751232
    >>> budget = fit_token_budget(curve, longest=4096, total_bytes=80 << 30)
    >>> budget.max_tokens_per_batch, curve(budget.max_tokens_per_batch) <= 0.9 * (80 << 30)
    (662720, True)
    >>> measured = []
    >>> budget = fit_token_budget(lambda t: measured.append(t) or curve(t), longest=4096, total_bytes=80 << 30, ceiling=100_000)
    >>> budget.max_tokens_per_batch, budget.ceiling, measured
    (99968, 99968, [4096, 8192, 99968])
    """
    cap = math.inf if ceiling is None else max(longest, validate_positive_int("ceiling", ceiling) // 64 * 64)
    alone = measure(longest)
    if alone is None:
        raise ValueError(
            f"One example of {longest} tokens does not fit on this GPU ({total_bytes / _GIB:.2f} GiB): forward and "
            f"backward on it alone ran out of memory. {NOT_ONE}"
        )
    peaks = {longest: alone}
    peaks[2 * longest] = measure(2 * longest) or total_bytes
    budget = plan_token_budget(
        peaks,
        longest=longest,
        total_bytes=total_bytes,
        optimizer_bytes=optimizer_bytes,
        memory_fraction=memory_fraction,
    )
    target = memory_fraction * total_bytes - optimizer_bytes
    fitted = max((t for t, p in peaks.items() if p <= target and t <= cap), default=longest)  # the largest that fit
    failed = min((t for t, p in peaks.items() if p > target), default=None)  # the smallest that did not
    tokens = min(budget.max_tokens_per_batch, cap)
    for _ in range(checks):
        if tokens in peaks or tokens <= fitted:
            break
        peak = measure(tokens)
        peaks[tokens] = total_bytes if peak is None else peak
        if peaks[tokens] <= target:
            fitted = tokens
            if failed is None or failed - fitted <= fitted // 16:
                break
            tokens = (fitted + failed) // 2
        elif peak is None:  # out of memory: no slope to redraw from
            failed = tokens
            tokens = int((fitted * failed) ** 0.5) if failed > 16 * fitted else (fitted + failed) // 2
        else:  # measured above the line: the line redrawn through it
            failed = tokens
            line = {longest: peaks[longest], tokens: peaks[tokens]}
            planned = plan_token_budget(line, longest=longest, total_bytes=total_bytes,
                                        optimizer_bytes=optimizer_bytes, memory_fraction=memory_fraction)  # fmt: skip
            budget, tokens = planned, min(planned.max_tokens_per_batch, failed - 64)
        tokens = max(longest, min(tokens, cap) // 64 * 64)
    return replace(budget, max_tokens_per_batch=fitted, ceiling=fitted if fitted == cap else None)
