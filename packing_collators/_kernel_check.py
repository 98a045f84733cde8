"""A kernel trusted on a device only once it has run there: built, run on a small case, compared with torch's numbers.

The library's Triton kernels (the chunked loss's rows, fused/'s SwiGLU and rotary embedding) each hold a
:class:`DeviceCheck`: ``usable(device)`` is true on CUDA, with Triton installed, once their check passed there
(:func:`checked_on`, once per device, autograd on whichever context the first call comes from: a no-grad probe's
forward too); where the check fails to build or run, or gives other numbers, a warning names the kernel, the device
and what runs instead, and the caller keeps its torch path there.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Callable

import torch

__all__ = ["DeviceCheck", "checked_on"]


class DeviceCheck:
    """Where a Triton kernel runs: ``usable(device)``; ``works_on(device)`` runs ``check`` there once (cached; its
    ``cache_clear()`` forgets) and warns where it fails (:func:`checked_on`).

    >>> trusted = DeviceCheck(lambda device: True, "a kernel", "torch", "torch runs")
    >>> trusted.usable(torch.device("cpu")), trusted.works_on("cpu")  # CUDA only; the check itself passes anywhere
    (False, True)
    """

    def __init__(self, check: Callable[[str], bool], kernel: str, reference: str, instead: str) -> None:
        self.works_on = functools.lru_cache(maxsize=None)(
            lambda device: checked_on(device, check, kernel, reference, instead)
        )

    def usable(self, device: torch.device) -> bool:
        return device.type == "cuda" and importlib.util.find_spec("triton") is not None and self.works_on(str(device))


def checked_on(device: str, check: Callable[[str], bool], kernel: str, reference: str, instead: str) -> bool:
    """``check(device)``: whether ``kernel`` gives ``reference``'s numbers there; False, with a warning saying what
    runs ``instead``, where it raises or differs.

    >>> checked_on("cpu", lambda device: True, "a kernel", "torch", "torch runs")
    True
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     checked_on("cpu", lambda device: 1 / 0, "a kernel", "torch", "torch runs")
    False
    >>> str(caught[0].message)
    'packing_collators: a kernel failed on cpu (ZeroDivisionError: division by zero); torch runs there.'
    """
    try:  # the first call may come from a no-grad forward (a probe, an evaluation, old log-probs)
        with torch.inference_mode(False), torch.enable_grad():  # the check's backward needs autograd all the same
            same = bool(check(device))
    except Exception as error:  # noqa: BLE001 - any failure to build or run it: the torch path stays
        warnings.warn(f"packing_collators: {kernel} failed on {device} ({type(error).__name__}: {str(error)[:300]}); "
                      f"{instead} there.", stacklevel=3)  # fmt: skip
        return False
    if not same:
        warnings.warn(f"packing_collators: {kernel} computed other numbers than {reference} on {device}; {instead} there.",
                      stacklevel=3)  # fmt: skip
    return same
