"""What the tests share: the standard length distributions, the tiny models, and two markers.

- ``standard_lengths`` (a fixture) is ``lengths_of`` below: token counts per example from the
  project's standard distributions, seeded, int64. ``standard_lengths("sft", 1000, seed=3)``;
  ``"reasoning"`` and ``"long_tail"`` are the long-context ones (up to 32k and 8k tokens).
  It is ``benchmarks/_lengths.py``'s function itself, so the benchmark scripts draw the same numbers.
- Tiny randomly initialised models, example batches and a reference varlen kernel live in
  ``tests/_tiny_models.py``, their one home: tests import it, and so do the worker processes
  that the distributed tests start (which cannot see fixtures).
- Markers: ``slow`` (seconds each: example scripts, subprocesses, several processes) and
  ``distributed`` (several torch.distributed processes). ``pytest -m "not slow"`` runs the rest
  (what ``make test-oldest`` runs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The standard distributions have one home, benchmarks/_lengths.py (numpy only), shared with the benchmarks.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _lengths import DISTRIBUTIONS, LOGNORMAL, lengths_of, lognormal_lengths  # noqa: E402, F401


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
    window by the longest sequence (tests/attention/test_varlen_attention.py tests that); the other tests expect
    ``(-1, 0)``. Patched only where the module is loaded already, so torch-free tests stay torch-free.
    """
    module = sys.modules.get("packing_collators.attention._varlen")
    if module is not None:
        monkeypatch.setattr(module, "_varlen_can_pick_cudnn", lambda: False)
