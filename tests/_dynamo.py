"""Dynamo reset between compile tests, as a process's next compile sees it.

``torch._dynamo.reset()`` also forgets which float inputs Dynamo learned to specialize (``TensorifyState``), so the
first compile after it traces its frame, fails to turn a Python float into a tensor, and traces it again: a fresh
process pays that once, a test suite that resets before every compile test paid it in each (about half of each
compile's time on CI's CPUs). :func:`reset_dynamo` resets everything else (compiled code, guards, counters, the
frames' dynamic-shape state) and keeps what was learned: the graphs are the ones a fresh process compiles.
"""

from __future__ import annotations

__all__ = ["reset_dynamo"]


def reset_dynamo() -> None:
    import torch

    try:
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:  # a torch without it: the plain reset
        torch._dynamo.reset()
        return
    learned = set(TensorifyState.force_specializations)
    torch._dynamo.reset()
    TensorifyState.force_specializations.update(learned)
