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

    def autograd_on(device, variant):
        return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()

    with torch.inference_mode():
        assert DeviceCheck(autograd_on, "a kernel", "torch", "torch runs").works_on("cpu")


# The variant of each kernel a bf16 model trains with: the check builds this one (its compile is the one training
# reuses), against torch's numbers in float32 on the same inputs.
TRAINING_VARIANTS = {
    "swiglu": [(torch.bfloat16, True), (torch.float16, False)],
    "rope": [(torch.bfloat16, 128), (torch.bfloat16, 80)],
    "loss rows": [(torch.bfloat16, 4_608, False), (torch.bfloat16, 300, True)],
}


@pytest.mark.parametrize("kernel, variant", [(k, v) for k, vs in TRAINING_VARIANTS.items() for v in vs])
def test_the_check_builds_the_variant_training_runs_and_passes_the_kernels_numbers(kernel, variant):
    trusted = _checks()[kernel]
    trusted.works_on.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert trusted.works_on("cpu", variant)
    finally:
        trusted.works_on.cache_clear()


def test_in_bf16_the_check_still_fails_a_kernel_that_is_off(monkeypatch):
    from packing_collators.fused import _mlp

    # 3% off: six times one bfloat16 rounding, the tolerance of a check in bf16
    monkeypatch.setattr(_mlp._SwiGLU, "apply", lambda g, u: torch.nn.functional.silu(g) * u * 1.03)
    _mlp._trusted.works_on.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"fuse_swiglu's Triton kernel \(bfloat16, True\) computed other numbers"):
            assert not _mlp._trusted.works_on("cpu", (torch.bfloat16, True))
    finally:
        _mlp._trusted.works_on.cache_clear()


def test_each_call_asks_for_the_variant_its_own_tensors_build(monkeypatch):
    from packing_collators.fused import _mlp, _rope
    from packing_collators.loss import _chunked

    asked = []

    def record(device, variant=None):
        asked.append(variant)
        return False  # torch's path runs on

    monkeypatch.setattr(_mlp, "usable", record)
    monkeypatch.setattr(_rope, "usable", record)
    monkeypatch.setattr(_chunked._triton_rows, "usable", record)
    gate = torch.randn(3, 16, dtype=torch.bfloat16)
    _mlp.swiglu(gate, gate)
    q = torch.randn(1, 5, 4, 80, dtype=torch.bfloat16).transpose(1, 2)
    cos = torch.randn(1, 5, 80, dtype=torch.bfloat16)
    _rope._takes(q, q, cos, cos, (), {})
    hidden, weight = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(300, 8, dtype=torch.bfloat16)
    _chunked._compiled(True, hidden, weight, _chunked.LogitTransform(softcap=30.0))
    assert asked == [(torch.bfloat16, True), (torch.bfloat16, 80), (torch.bfloat16, 300, True)]
