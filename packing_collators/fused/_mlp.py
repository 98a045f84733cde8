"""fuse_swiglu(model): each gated MLP's ``silu(gate) * up`` as one Triton kernel each way, where the MLP computes it.

transformers' Llama-family MLP runs ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` op by op in eager mode: silu,
then the product, five passes over (tokens, intermediate) forward and nine backward (silu's backward and the
product's two), and it keeps silu's output for the product's backward. One kernel forward reads gate and up and
writes the product (three passes); one backward reads the gradient, gate and up and writes both gradients (five),
and only gate and up are kept. Under ``torch.compile`` Inductor fuses the same: this is for eager training, beside
:func:`~packing_collators.fused.fuse_rms_norms`.

Which MLPs: each module with ``gate_proj``, ``up_proj`` and ``down_proj`` (``nn.Linear``) and an ``act_fn`` whose own
forward gives ``down_proj(silu(gate_proj(x)) * up_proj(x))`` on a random input: measured on the module, so GELU MLPs
(Gemma's) and anything else keep their own forward. Numerics: silu and the product in float32, rounded once to the
dtype (transformers rounds silu's output first: one rounding fewer). The kernel runs where the tensors are on CUDA
and Triton is installed, checked once per device against torch (a warning and torch's ops where it fails); elsewhere
the fused forward computes ``silu(gate) * up`` with torch, the module's own numbers.

>>> from transformers.models.llama.modeling_llama import LlamaMLP
>>> from transformers import LlamaConfig
>>> mlp = LlamaMLP(LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=2))
>>> x = torch.randn(3, 8)
>>> expected = mlp(x)
>>> fuse_swiglu(mlp)
1
>>> torch.equal(mlp(x), expected)  # on the CPU: torch's silu and product, as the module's own
True
"""

from __future__ import annotations

import torch

from .._kernel_check import DeviceCheck, same_as_float32

from ._swap import swap_forwards

__all__ = ["fuse_swiglu", "swiglu"]

_BLOCK = 1024  # elements a program


def fuse_swiglu(model: torch.nn.Module) -> int:
    """Make every gated MLP of ``model`` whose forward computes ``down(silu(gate(x)) * up(x))`` run the product as
    one kernel each way; returns how many. Idempotent; the projections are called as modules (hooks, FSDP2, PEFT)."""
    return swap_forwards(model, _computes_swiglu, _fused_forward)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``: one Triton kernel each way on CUDA (float32 inside, one rounding), else torch's ops (also
    inside ``torch.compile``, whose Inductor fuses them: ``compile_layers`` on a fused model compiles as before).

    >>> g, u = torch.randn(2, 5), torch.randn(2, 5)
    >>> torch.equal(swiglu(g, u), torch.nn.functional.silu(g) * u)
    True
    """
    if (
        gate.shape == up.shape and gate.dtype == up.dtype and not torch.compiler.is_compiling()
        and usable(gate.device, _variant(gate))
    ):  # fmt: skip
        return _SwiGLU.apply(gate, up)  # (a compiled graph gets torch's ops, which Inductor fuses itself)
    return torch.nn.functional.silu(gate) * up


def usable(device: torch.device, variant: tuple | None = None) -> bool:
    """Whether the kernels run for tensors on ``device``: CUDA, Triton installed, checked there once per variant
    (:func:`_variant`: both kernels against float32 silu and autograd on the same inputs, a short last block
    included; a warning and torch's ops where they differ).

    >>> usable(torch.device("cpu"))
    False
    """
    return _trusted.usable(device, variant)


def _variant(gate: torch.Tensor) -> tuple:
    """What Triton builds the kernels for, on ``gate``'s tensors: their dtype, and whether the element count is a
    multiple of 16 (Triton specializes an integer argument on it). The check runs that variant, which training then
    reuses.

    >>> _variant(torch.zeros(2, 8, dtype=torch.bfloat16)), _variant(torch.zeros(3))
    ((torch.bfloat16, True), (torch.float32, False))
    """
    return gate.dtype, gate.numel() % 16 == 0


def _check(device: str, variant: tuple | None) -> bool:
    dtype, aligned = variant or (torch.float32, False)
    generator = torch.Generator().manual_seed(0)
    n = 2 * _BLOCK + (16 if aligned else 3)  # a short last block either way
    gate, up, grad = (torch.randn(n, generator=generator).mul(4).to(device, dtype) for _ in range(3))
    return same_as_float32(_SwiGLU.apply, lambda g, u: torch.nn.functional.silu(g) * u, [gate, up], grad,
                           differentiate=[0, 1], rtol=1e-5, grad_rtol=1e-4)  # fmt: skip


_trusted = DeviceCheck(_check, "fuse_swiglu's Triton kernel", "torch", "the MLPs run torch's silu and product")


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        from . import _swiglu_kernels

        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        n = gate.numel()
        _swiglu_kernels.forward[(triton_blocks(n),)](gate, up, out, n, BLOCK=_BLOCK)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from . import _swiglu_kernels

        gate, up = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        _swiglu_kernels.backward[(triton_blocks(n),)](grad_out, gate, up, grad_gate, grad_up, n, BLOCK=_BLOCK)
        return grad_gate, grad_up


def triton_blocks(n: int) -> int:
    """Programs for ``n`` elements, ``_BLOCK`` each (at least one).

    >>> triton_blocks(1), triton_blocks(1024), triton_blocks(1025)
    (1, 1, 2)
    """
    return max(1, -(-n // _BLOCK))


def _computes_swiglu(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a gated MLP whose forward is ``down(silu(gate(x)) * up(x))``, run once to see."""
    projections = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, torch.nn.Linear) for p in projections) or not callable(getattr(module, "act_fn", None)):
        return False
    weight = projections[0].weight
    if weight.device.type == "meta":
        return False
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, projections[0].in_features, generator=g) * 2).to(weight.device, weight.dtype)
    try:
        with torch.no_grad():
            own = module(x)
            expected = module.down_proj(torch.nn.functional.silu(module.gate_proj(x)) * module.up_proj(x))
    except Exception:  # noqa: BLE001 - an MLP that cannot run on this probe keeps its forward
        return False
    if not isinstance(own, torch.Tensor) or own.shape != expected.shape:
        return False
    tolerance = 1e-5 if weight.dtype == torch.float32 else 2e-2  # silu against GELU differs by ~0.1 of a unit
    return torch.allclose(own.float(), expected.float(), rtol=tolerance, atol=tolerance)


def _fused_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if args or kwargs:
        return self._packing_own_forward(x, *args, **kwargs)
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
