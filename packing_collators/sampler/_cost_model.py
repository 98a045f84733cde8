"""Fit the sampler's cost model from measured batch times: ``seconds ~ tokens + attention + fixed``.

The multipack sampler balances ranks by ``cost = tokens + attention_weight * attention``,
where ``attention`` is a batch's sum of squared example lengths. The default weight,
``1 / max_tokens_per_batch``, is a guess; when ranks still wait on each other (a high
``step_imbalance`` measured on the GPUs, not the planned one), time a few dozen batches of
varied sizes and example lengths and fit the weight instead::

    batch   tokens   attention (sum of len**2)   seconds (forward + backward)
    0        8,192      8,388,608                  0.050
    1       16,384     16,777,216                  0.100
    2       16,384    268,435,456                  0.220
    ...
    seconds ~ per_token * tokens + per_attention * attention + fixed    (least squares)
    attention_weight = per_attention / per_token   ->  MultipackBatchSampler(..., attention_weight=...)

The three coefficients are kept non-negative: the fit is the best least-squares fit over
every subset of the terms whose coefficients are all >= 0 (a term left out has coefficient 0),
which is the exact non-negative optimum. A ``per_token`` of 0 gives ``attention_weight = inf``: time follows
attention alone, so use ``balance="attention"``. Fits from batches measured on GPUs: docs/sampler.md
("Balancing ranks").

Cost: one least-squares solve of an (n, 3) matrix, well under a millisecond for thousands of
batches. Pure numpy; no torch here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CostFit", "fit_attention_weight"]

_MEASURE = "measure batches of several token counts and example lengths (e.g. 1/4 to all of the budget, short and long examples)"


@dataclass(frozen=True)
class CostFit:
    """The fitted time of a batch: ``per_token * tokens + per_attention * attention + fixed`` seconds.

    Attributes:
        per_token: seconds per token (the linear layers), >= 0.
        per_attention: seconds per squared token of an example (attention), >= 0.
        fixed: seconds per batch whatever it holds (launches, optimizer hooks), >= 0.
        attention_weight: ``per_attention / per_token``, the value to pass to
            ``MultipackBatchSampler(..., attention_weight=...)`` or ``plan_epoch``
            (``inf`` when ``per_token`` is 0: use ``balance="attention"``).
        r2: the fraction of the variance in the measured seconds the fit explains (1.0: exact).

    >>> fit = CostFit(per_token=1e-6, per_attention=2e-11, fixed=0.01, attention_weight=2e-05, r2=1.0)
    >>> fit.predict([16384, 16384], [16384 * 1024, 16384**2]).round(4).tolist()
    [0.0267, 0.0318]
    """

    per_token: float
    per_attention: float
    fixed: float
    attention_weight: float
    r2: float

    def predict(self, tokens: Sequence[float] | np.ndarray, attention: Sequence[float] | np.ndarray) -> np.ndarray:
        """float64 (n,) predicted seconds of batches with these tokens and attention (sum of squared lengths)."""
        tokens, attention = np.asarray(tokens, np.float64), np.asarray(attention, np.float64)
        return self.per_token * tokens + self.per_attention * attention + self.fixed


def _as_measurements(**arrays) -> dict[str, np.ndarray]:
    """The three arrays as float64, or the error naming the first bad one and the fix."""
    out = {}
    for name, values in arrays.items():
        array = np.asarray(values, dtype=np.float64)
        if array.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional (one value per measured batch), got shape {array.shape}.")
        bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"{name}[{i}] is {float(array[i])!r}; every value must be finite and >= 0. "
                "Leave out batches whose measurement failed."
            )
        out[name] = array
    sizes = {name: len(array) for name, array in out.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"tokens, attention and seconds must have one value per measured batch each, got lengths {sizes}. "
            "Pass the three measurements of the same batches."
        )
    if sizes["seconds"] < 3:
        raise ValueError(
            f"Fitting three coefficients needs at least 3 measured batches, got {sizes['seconds']}; {_MEASURE}."
        )
    return out


def _check_separable(tokens: np.ndarray, attention: np.ndarray, design: np.ndarray) -> None:
    """The error when the measured batches cannot tell the three terms apart."""
    constant = [name for name, values in (("tokens", tokens), ("attention", attention)) if np.ptp(values) == 0]
    if constant:
        raise ValueError(
            f"Every measured batch has the same {' and '.join(constant)}, so its time cannot be told apart "
            f"from the fixed time per batch; {_MEASURE}."
        )
    if np.linalg.matrix_rank(design) < 3:
        raise ValueError(
            "attention is proportional to tokens in every measured batch (all examples of one length?), so "
            f"the two terms cannot be told apart; {_MEASURE}."
        )


def _nonnegative_least_squares(design: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """The least-squares coefficients >= 0 (exact: the best fit over every subset of the terms).

    With three terms there are seven subsets; the best one whose own least-squares coefficients
    are all >= 0 is the non-negative optimum. A coefficient whose term adds less than 1e-9 of
    the longest measured time is read as 0 (it is rounding, not a cost).
    """
    terms = design.shape[1]
    best, best_residual = np.zeros(terms), float((seconds**2).sum())
    for subset in itertools.product((True, False), repeat=terms):
        keep = np.array(subset)
        if not keep.any():
            continue
        coefficients = np.zeros(terms)
        coefficients[keep] = np.linalg.lstsq(design[:, keep], seconds, rcond=None)[0]
        coefficients[np.abs(coefficients) * design.max(0) < 1e-9 * seconds.max()] = 0.0
        if (coefficients < 0).any():
            continue
        residual = float(((seconds - design @ coefficients) ** 2).sum())
        if residual < best_residual * (1 - 1e-12):  # ties keep the earlier, fuller subset
            best, best_residual = coefficients, residual
    return best


def fit_attention_weight(
    tokens: Sequence[float] | np.ndarray,
    attention: Sequence[float] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
) -> CostFit:
    """Fit ``seconds ~ per_token * tokens + per_attention * attention + fixed`` over measured batches.

    Args:
        tokens: (n,) tokens in each measured batch.
        attention: (n,) sum of squared example lengths in each batch (``EpochPlan.batch_attention``).
        seconds: (n,) each batch's measured forward + backward time (after warm-up, synchronised).

    Returns a :class:`CostFit`; pass its ``attention_weight`` to the sampler. Batches from a
    known model are recovered exactly:

    >>> tokens = np.array([4096, 8192, 8192, 16384, 16384])
    >>> attention = np.array([4096 * 512, 8192 * 256, 8192**2, 16384 * 1024, 16384**2])
    >>> seconds = 2e-6 * tokens + 5e-11 * attention + 0.004
    >>> fit = fit_attention_weight(tokens, attention, seconds)
    >>> round(fit.per_token * 1e6, 6), round(fit.per_attention * 1e11, 6), round(fit.fixed, 9), round(fit.r2, 9)
    (2.0, 5.0, 0.004, 1.0)
    >>> round(fit.attention_weight * 1e5, 6)  # vs the default 1 / 16384 = 6.1e-05
    2.5
    >>> fit_attention_weight([8192] * 3, [8192**2] * 3, [0.1, 0.11, 0.1])
    Traceback (most recent call last):
    ...
    ValueError: Every measured batch has the same tokens and attention, so its time cannot be told apart from the fixed time per batch; measure batches of several token counts and example lengths (e.g. 1/4 to all of the budget, short and long examples).
    """
    data = _as_measurements(tokens=tokens, attention=attention, seconds=seconds)
    tokens, attention, seconds = data["tokens"], data["attention"], data["seconds"]
    design = np.column_stack([tokens, attention, np.ones_like(tokens)])
    scale = np.abs(design).max(0)  # columns of ~1e4 and ~1e8: solve on [0, 1] columns, then scale back
    scale[scale == 0] = 1.0
    _check_separable(tokens, attention, design / scale)
    if np.ptp(seconds) == 0:
        raise ValueError(
            f"Every measured batch took the same time ({float(seconds[0])!r} s), so nothing can be fitted; "
            f"time each batch after warm-up with torch.cuda.synchronize() before reading the clock, and {_MEASURE}."
        )
    per_token, per_attention, fixed = (_nonnegative_least_squares(design / scale, seconds) / scale).tolist()
    residual = seconds - (per_token * tokens + per_attention * attention + fixed)
    total = float(((seconds - seconds.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    if per_token > 0:
        weight = per_attention / per_token
    else:
        weight = math.inf if per_attention > 0 else 0.0
    return CostFit(per_token=per_token, per_attention=per_attention, fixed=fixed, attention_weight=weight, r2=r2)
