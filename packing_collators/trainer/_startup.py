"""Where a packed trainer's time before its first step goes: each part timed, logged once at the first step.

    train() -> the train dataloader   "token_budget"      the budget's dry runs ("auto" measured, or checked)
            -> on_train_begin          "checks_and_probe"  PackingCheckCallback: static checks, the live probe
                                       "compile"           compile_layers' warm-up (torch.compile)
                                       "fa4_warm_up"       FlashAttention-4's kernels for the planned layouts
            of which                   "kernel_checks"     the Triton kernels' first run against torch's numbers
                                                           (inside whichever part first called each kernel)
    the first step begins  ->  one INFO line with these; ``PackingTrainer.startup_seconds`` keeps them

The parts are what the library adds before training; the Trainer's own setup (optimizer, accelerator) is not
timed here. A part that did not run is left out.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from .._kernel_check import check_seconds

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - transformers is a dependency
    raise ImportError("PackingTrainer needs transformers (pip install transformers).") from error

__all__ = ["StartupClock"]

logger = logging.getLogger(__name__)


class StartupClock(TrainerCallback):
    """The seconds of each part a packed trainer runs before its first step (``seconds``), logged as it begins:
    the blocks timed with :meth:`part`, and ``sources`` (name -> a callable returning the seconds a callback
    measured itself, or None), read when the first step begins.

    >>> clock = StartupClock(fa4_warm_up=lambda: 1.5, compile=lambda: None)
    >>> with clock.part("token_budget"):
    ...     pass
    >>> sorted(clock.collect())
    ['fa4_warm_up', 'token_budget']
    """

    def __init__(self, **sources) -> None:
        self.sources = sources
        self.seconds: dict[str, float] = {}
        self._checks_before = check_seconds()
        self._logged = False

    @contextmanager
    def part(self, name: str):
        """Time the block as part ``name`` (added to what that part took before)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def collect(self) -> dict[str, float]:
        """``seconds`` with the sources' and the kernel checks' (since this clock was made) read now."""
        for name, read in self.sources.items():
            value = read()
            if value:
                self.seconds[name] = float(value)
        checks = check_seconds() - self._checks_before
        if checks > 0:
            self.seconds["kernel_checks"] = checks
        return self.seconds

    def on_step_begin(self, args, state, control, **kwargs):
        if self._logged:
            return
        self._logged = True
        if self.collect():
            logger.info("Before the first step: %s (kernel checks are inside the part that first called each kernel)",
                        ", ".join(f"{name} {value:.2f} s" for name, value in self.seconds.items()))  # fmt: skip
