"""What the tests share: the standard length distributions, the tiny models, and two markers.

- ``standard_lengths`` (a fixture) is ``lengths_of`` below: token counts per example from the
  project's standard distributions, seeded, int64. ``standard_lengths("sft", 1000, seed=3)``;
  ``"reasoning"`` and ``"long_tail"`` are the long-context ones (up to 32k and 8k tokens).
  (``benchmarks/_shared.py`` draws the same numbers for the benchmark scripts.)
- Tiny randomly initialised models, example batches and a reference varlen kernel live in
  ``tests/_tiny_models.py``, their one home: tests import it, and so do the worker processes
  that the distributed tests start (which cannot see fixtures).
- Markers: ``slow`` (seconds each: example scripts, subprocesses, several processes) and
  ``distributed`` (several torch.distributed processes). ``pytest -m "not slow"`` runs the rest:
  37 s instead of 90 s for the whole suite on 2 shared cores.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

# name: (mean, sigma, low, high): lognormal(mean, sigma) clipped to [low, high]
LOGNORMAL = {
    "sft": (5.3, 0.9, 8, 2048),  # mean about 300 tokens
    "flan_like": (4.6, 0.8, 8, 2048),  # many short examples
    "orcamath_like": (6.0, 0.5, 32, 2048),  # longer
    "reasoning": (8.5, 0.7, 256, 32768),  # long context: reasoning traces, median 4.9k, mean about 6.3k
}
DISTRIBUTIONS = (*LOGNORMAL, "long_tail")  # long_tail: 95% lognormal(5.0, 0.7) + 5% uniform(1500, 8192)


def lognormal_lengths(n: int, mean: float, sigma: float, low: int, high: int, *, seed: int = 0) -> np.ndarray:
    """``n`` draws of lognormal(mean, sigma) clipped to [low, high], as int64."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean, sigma, n), low, high).astype(np.int64)


def lengths_of(distribution: str, n: int, seed: int = 0, *, high: int | None = None) -> np.ndarray:
    """Token counts of ``n`` examples from a standard distribution; ``high`` replaces its upper clip.

    >>> lengths_of("sft", 5).tolist()
    [224, 177, 356, 220, 123]
    """
    if distribution == "long_tail":
        rng = np.random.default_rng(seed)
        tail = rng.random(n) < 0.05
        x = np.where(tail, rng.uniform(1500, 8192, n), rng.lognormal(5.0, 0.7, n))
        return np.clip(x, 1, 8192 if high is None else high).astype(np.int64)
    if distribution not in LOGNORMAL:
        raise ValueError(f"unknown distribution {distribution!r}; choose one of {DISTRIBUTIONS}")
    mean, sigma, low, top = LOGNORMAL[distribution]
    return lognormal_lengths(n, mean, sigma, low, top if high is None else high, seed=seed)


@pytest.fixture(scope="session")
def standard_lengths():
    """``lengths_of``: ``standard_lengths("sft", n, seed=0, high=None)``."""
    return lengths_of


@pytest.fixture(scope="session")
def lognormal():
    """``lognormal_lengths``, for a test that needs a distribution of its own."""
    return lognormal_lengths


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes seconds (example scripts, subprocesses); deselect with -m 'not slow'"
    )
    config.addinivalue_line("markers", "distributed: starts several torch.distributed processes (gloo, CPU)")


@pytest.fixture(autouse=True)
def _varlen_windows_unbounded(monkeypatch):
    """packing_varlen passes windows as transformers' convention has them, whatever PyTorch runs the tests.

    On PyTorch 2.14, whose varlen_attn may route calls to cuDNN, the backend bounds an unbounded
    window by the longest sequence (tests/test_attention.py tests that); the other tests expect
    ``(-1, 0)``. Patched only where the module is loaded already, so torch-free tests stay torch-free.
    """
    module = sys.modules.get("packing_collators.trainer._varlen_attention")
    if module is not None:
        monkeypatch.setattr(module, "_varlen_can_pick_cudnn", lambda: False)
