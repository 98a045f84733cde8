"""The standard length distributions (token counts per example), seeded: one source for tests and benchmarks.

numpy only. ``benchmarks/_shared.py`` re-exports it for the benchmark scripts, and
``tests/conftest.py`` puts this folder on ``sys.path`` and serves ``lengths_of`` as the
``standard_lengths`` fixture, so a test and a benchmark asking for ``("sft", n, seed)`` get the
same numbers. It is test data, not library API.
"""

from __future__ import annotations

import numpy as np

# name: (mean, sigma, low, high): lognormal(mean, sigma) clipped to [low, high]; long_tail is drawn in lengths_of.
LOGNORMAL = {
    "sft": (5.3, 0.9, 8, 2048),  # mean about 300 tokens
    "flan_like": (4.6, 0.8, 8, 2048),  # many short examples
    "orcamath_like": (6.0, 0.5, 32, 2048),  # longer
    "reasoning": (8.5, 0.7, 256, 32768),  # long context: reasoning traces, median 4.9k, mean about 6.3k
}
DISTRIBUTIONS = (*LOGNORMAL, "long_tail")
LONG_CONTEXT = ("long_tail", "reasoning")  # the distributions for max lengths of 8k-32k
LONG_TAIL_MAX = 8192  # long_tail's default max length


def lognormal_lengths(n: int, mean: float, sigma: float, low: int, high: int, *, seed=0) -> np.ndarray:
    """``n`` draws of lognormal(mean, sigma) clipped to [low, high], as int64.

    >>> lognormal_lengths(3, 5.3, 0.9, 8, 2048).tolist()
    [224, 177, 356]
    """
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean, sigma, n), low, high).astype(np.int64)


def lengths_of(
    distribution: str, n: int, seed: int | np.random.Generator = 0, *, high: int | None = None
) -> np.ndarray:
    """Token counts (int64) of ``n`` examples from a standard distribution, seeded.

    ``seed`` may be a ``np.random.Generator``: it is drawn from (and advanced), for a script that
    draws its tokens from the same stream afterwards. ``high`` replaces the upper clip; for
    ``long_tail`` it is the max length the tail reaches: 95% lognormal(5.0, 0.7) + 5%
    uniform(1500, high), ``high`` 8192 by default (2048 and 32768 make the same mix at those max
    lengths: the tail spreads up to ``high`` rather than piling up at it).

    >>> lengths_of("sft", 5).tolist()
    [224, 177, 356, 220, 123]
    >>> lengths = lengths_of("reasoning", 100_000)
    >>> int(lengths.min()), int(lengths.max()), round(float(lengths.mean()), -2)
    (256, 32768, 6200.0)
    >>> [int(lengths_of("long_tail", 100_000, high=h).max()) for h in (2048, 8192, 32768)]
    [2048, 8190, 32762]
    >>> int((lengths_of("long_tail", 100_000, high=2048) == 2048).sum())
    7
    """
    if distribution == "long_tail":
        rng = np.random.default_rng(seed)
        top = LONG_TAIL_MAX if high is None else high
        tail = rng.random(n) < 0.05
        x = np.where(tail, rng.uniform(min(1500, top), top, n), rng.lognormal(5.0, 0.7, n))
        return np.clip(x, 1, top).astype(np.int64)
    if distribution not in LOGNORMAL:
        raise ValueError(f"unknown distribution {distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    mean, sigma, low, top = LOGNORMAL[distribution]
    return lognormal_lengths(n, mean, sigma, low, top if high is None else high, seed=seed)
