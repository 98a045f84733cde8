"""What the tests share: the standard length distributions, the tiny models, and two markers.

- ``standard_lengths`` (a fixture) is ``lengths_of`` below: token counts per example from the
  project's standard distributions, seeded, int64. ``standard_lengths("sft", 1000, seed=3)``;
  ``"reasoning"`` and ``"long_tail"`` are the long-context ones (up to 32k and 8k tokens).
  It is ``benchmarks/_lengths.py``'s function itself, so the benchmark scripts draw the same numbers.
- Tiny randomly initialised models, example batches and a reference varlen kernel live in
  ``tests/_tiny_models.py``, their one home: tests import it, and so do the worker processes
  that the distributed tests start (which cannot see fixtures).
- ``fresh_dynamo`` resets Dynamo's caches around a test (the compile tests opt in with ``usefixtures``);
  ``fa4_reference`` runs ``packing_fa4`` on the CPU: FA4's custom ops call the float32 reference
  interface, eager calls the reference kernel.
- Markers: ``slow`` (seconds each: example scripts, subprocesses, several processes) and
  ``distributed`` (several torch.distributed processes). ``pytest -m "not slow"`` runs the rest
  (what ``make test-oldest`` runs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Triton's kernels (the chunked loss's rows) run on the CPU under its interpreter: triton.jit reads this as Triton's
# modules load, so it is set before anything imports Triton. It changes nothing where Triton is not called.
os.environ.setdefault("TRITON_INTERPRET", "1")
# With Triton importable, Inductor compiles through a pool of worker processes it starts for Triton's kernels; the
# tests' graphs are the CPU's (C++), so the pool only costs its start-up (the FSDP2 compile tests: 61 s against 49 s).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

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


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters reset before and after the test (all but what a fresh process would learn at
    its first compile and keep: ``_dynamo.py``)."""
    from _dynamo import reset_dynamo

    reset_dynamo()
    yield
    reset_dynamo()


@pytest.fixture
def fa4_reference(monkeypatch):
    """packing_fa4 on CPU: the custom ops call the reference interface, eager calls the reference kernel."""
    from _tiny_models import fake_fa4, reference_fa4_interface

    from packing_collators import register_fa4_attention
    from packing_collators.attention import _fa4, _fa4_ops

    register_fa4_attention()
    monkeypatch.setattr(_fa4_ops, "_interface", reference_fa4_interface)
    monkeypatch.setattr(_fa4, "_kernel", lambda query: fake_fa4)
