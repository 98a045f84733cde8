"""The Triton kernels' device checks (``_kernel_check.DeviceCheck``) pass in whichever context their first call comes
from. The first call is often a no-grad forward: the live probe, an evaluation, GRPO's old log-probabilities. A check
that ran its backward there failed ("element 0 of tensors does not require grad"), with a warning, and kept the
kernel off for the whole run: seen on an H100 for fuse_swiglu and fuse_rope (benchmarks/results/
vs_trl_like_for_like_h100). On the CPU the checks run Triton's interpreter, the same code."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("triton")


def _checks():
    from packing_collators.fused import _mlp, _rope
    from packing_collators.loss import _triton_rows

    return {"swiglu": _mlp._trusted, "rope": _rope._trusted, "loss rows": _triton_rows._trusted}


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("kernel", ["swiglu", "rope", "loss rows"])
def test_a_kernel_checked_first_under_no_grad_passes_its_check(kernel, context):
    trusted = _checks()[kernel]
    trusted.works_on.cache_clear()
    try:
        with getattr(torch, context)(), warnings.catch_warnings():
            warnings.simplefilter("error")  # a failed check warns: an error here
            assert trusted.works_on("cpu")
        assert torch.is_grad_enabled()  # and the caller's context is back as it was
    finally:
        trusted.works_on.cache_clear()


def test_the_check_runs_with_autograd_whatever_the_callers_context():
    from packing_collators._kernel_check import DeviceCheck

    def autograd_on(device):
        return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()

    with torch.inference_mode():
        assert DeviceCheck(autograd_on, "a kernel", "torch", "torch runs").works_on("cpu")
