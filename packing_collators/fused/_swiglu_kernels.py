"""The Triton kernels of :mod:`packing_collators.fused._mlp`; imported only where they run, since Triton is
optional and ``triton.jit`` reads ``TRITON_INTERPRET`` as this module loads."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["backward", "forward"]


@triton.jit
def forward(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """``y = silu(g) * u`` over ``BLOCK`` elements a program, in float32, rounded once to ``y``'s dtype."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    g = tl.load(g_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    sigmoid = 1.0 / (1.0 + tl.exp(-g))
    tl.store(y_ptr + offsets, (g * sigmoid * u).to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def backward(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    """``du = dy * silu(g)``, ``dg = dy * u * silu'(g)`` (``silu' = s (1 + g (1 - s))``, s the sigmoid), in float32."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    dy = tl.load(dy_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    sigmoid = 1.0 / (1.0 + tl.exp(-g))
    tl.store(du_ptr + offsets, (dy * g * sigmoid).to(du_ptr.dtype.element_ty), mask=inside)
    tl.store(dg_ptr + offsets, (dy * u * sigmoid * (1.0 + g * (1.0 - sigmoid))).to(dg_ptr.dtype.element_ty), mask=inside)
