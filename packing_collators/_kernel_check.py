"""A kernel trusted on a device only once it has run there: built, run on a small case, compared with torch's numbers.

The library's Triton kernels (the chunked loss's rows, fused/'s SwiGLU and rotary embedding) each hold a
:class:`DeviceCheck`: ``usable(device, variant)`` is true on CUDA, with Triton installed, once their check passed
there (:func:`checked_on`, once per device and variant of the kernel: the dtype and constants the caller's tensors
build it for, so the check compiles the kernel training then runs; autograd on whichever context the first call
comes from: a no-grad probe's forward too); where the check fails to build or run, or gives other numbers, a warning
names the kernel, the device and what runs instead, and the caller keeps its torch path there.
"""

from __future__ import annotations

import functools
import importlib.util
import time
import warnings
from collections.abc import Callable

import torch

__all__ = ["DeviceCheck", "check_seconds", "checked_on", "same_as_float32", "tolerance"]

_seconds = [0.0]  # the checks' wall time in this process (the first step's startup report reads it)


def check_seconds() -> float:
    """Seconds the kernels' device checks took in this process so far (building the kernels included)."""
    return _seconds[0]


class DeviceCheck:
    """Where a Triton kernel runs: ``usable(device, variant)``; ``works_on(device, variant)`` runs
    ``check(device, variant)`` there once per variant (cached; its ``cache_clear()`` forgets) and warns where it fails
    (:func:`checked_on`).

    A variant is what the kernel is built for (the dtype, a block width, a compile-time constant: a hashable
    tuple), so the check builds the very kernel the caller's tensors run, not another one: Triton compiles one per
    such variant (a second or more each, on a fresh machine), and a check on a variant training never runs would
    add its compile before the first step. ``None``: the check's own default variant.

    >>> trusted = DeviceCheck(lambda device, variant: True, "a kernel", "torch", "torch runs")
    >>> trusted.usable(torch.device("cpu")), trusted.works_on("cpu")  # CUDA only; the check itself passes anywhere
    (False, True)
    """

    def __init__(self, check: Callable[[str, tuple | None], bool], kernel: str, reference: str, instead: str) -> None:
        def works_on(device: str, variant: tuple | None = None) -> bool:
            named = kernel if variant is None else f"{kernel} ({', '.join(_text(v) for v in variant)})"
            return checked_on(device, lambda where: check(where, variant), named, reference, instead)

        self.works_on = functools.lru_cache(maxsize=None)(works_on)

    def usable(self, device: torch.device, variant: tuple | None = None) -> bool:
        return (
            device.type == "cuda" and importlib.util.find_spec("triton") is not None
            and self.works_on(str(device), variant)
        )  # fmt: skip


def _text(value) -> str:
    """A variant's part as the warning names it: ``bfloat16``, not ``torch.bfloat16``.

    >>> _text(torch.bfloat16), _text(128)
    ('bfloat16', '128')
    """
    return str(value).removeprefix("torch.")


def tolerance(dtype: torch.dtype, floor: float) -> float:
    """The relative tolerance of a check in ``dtype`` against float32 numbers of the same inputs: ``floor``, or the
    dtype's epsilon where larger (one rounding to bfloat16 is within half of it).

    >>> tolerance(torch.float32, 1e-5), tolerance(torch.bfloat16, 1e-5)
    (1e-05, 0.0078125)
    """
    return max(floor, torch.finfo(dtype).eps)


def same_as_float32(ours, reference, inputs, grad, *, differentiate, rtol: float, grad_rtol: float) -> bool:
    """Whether ``ours(*inputs)`` and its gradients (to the inputs at the indices ``differentiate``, from ``grad``)
    are ``reference``'s on the same inputs in float32: within ``rtol`` and ``grad_rtol`` (each raised to the inputs'
    epsilon, one rounding of theirs) and an absolute 1e-5. The inputs keep their layout (a transposed view stays
    one).

    >>> x = torch.randn(5, dtype=torch.bfloat16)
    >>> same_as_float32(lambda t: t * 2, lambda t: t + t, [x], torch.ones(5), differentiate=[0], rtol=1e-5,
    ...                 grad_rtol=1e-5)
    True
    """
    results = []
    for function, cast in ((ours, lambda t: t), (reference, torch.Tensor.float)):
        args = [cast(t).detach().requires_grad_(i in differentiate) for i, t in enumerate(inputs)]
        out = function(*args)
        grads = torch.autograd.grad(out, [args[i] for i in differentiate], cast(grad.to(inputs[0].dtype)))
        results.append([t.float() for t in (out, *grads)])
    (got, *got_grads), (want, *want_grads) = results
    dtype = inputs[0].dtype
    return torch.allclose(got, want, rtol=tolerance(dtype, rtol), atol=1e-5) and all(
        torch.allclose(a, b, rtol=tolerance(dtype, grad_rtol), atol=1e-5) for a, b in zip(got_grads, want_grads)
    )


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
    started = time.perf_counter()
    try:  # the first call may come from a no-grad forward (a probe, an evaluation, old log-probs)
        with torch.inference_mode(False), torch.enable_grad():  # the check's backward needs autograd all the same
            same = bool(check(device))
    except Exception as error:  # noqa: BLE001 - any failure to build or run it: the torch path stays
        warnings.warn(f"packing_collators: {kernel} failed on {device} ({type(error).__name__}: {str(error)[:300]}); "
                      f"{instead} there.", stacklevel=3)  # fmt: skip
        return False
    finally:
        _seconds[0] += time.perf_counter() - started
    if not same:
        warnings.warn(f"packing_collators: {kernel} computed other numbers than {reference} on {device}; {instead} there.",
                      stacklevel=3)  # fmt: skip
    return same
