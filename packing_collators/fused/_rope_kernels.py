"""The Triton kernel of :mod:`packing_collators.fused._rope`; imported only where it runs, since Triton is optional
and ``triton.jit`` reads ``TRITON_INTERPRET`` as this module loads."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rotate"]


# rows, heads and tokens change with every batch; specialized (on being a multiple of 16), each new kind of batch
# would build the kernel again in the first steps. They only index rows, so the built kernel is the same.
@triton.jit(do_not_specialize=["rows", "heads", "seq"])
def rotate(x_ptr, cos_ptr, sin_ptr, y_ptr, rows, heads, seq, x_b, x_h, x_t, y_b, y_h, y_t, c_b, c_t,
           HALF: tl.constexpr, HALF_P2: tl.constexpr, ROWS: tl.constexpr, INVERSE: tl.constexpr):  # fmt: skip
    """``ROWS`` (batch, head, position) rows of ``x`` a program, each rotated by its position's angles in float32 and
    rounded once: ``y1 = x1 c1 - x2 s1``, ``y2 = x2 c2 + x1 s2`` (the halves of the head dimension; transformers'
    ``x * cos + rotate_half(x) * sin``). ``INVERSE``: the transpose, ``y1 = x1 c1 + x2 s2``, ``y2 = x2 c2 - x1 s1``,
    which is the gradient. Strides in elements; the head dimension's is 1 everywhere."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    t = row % seq
    h = (row // seq) % heads
    b = row // (seq * heads)
    d = tl.arange(0, HALF_P2)
    mask = (row < rows)[:, None] & (d < HALF)[None, :]
    x_at = (b * x_b + h * x_h + t * x_t)[:, None] + d[None, :]
    y_at = (b * y_b + h * y_h + t * y_t)[:, None] + d[None, :]
    c_at = (b * c_b + t * c_t)[:, None] + d[None, :]
    x1 = tl.load(x_ptr + x_at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_at + HALF, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + c_at, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + c_at + HALF, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + c_at, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + c_at + HALF, mask=mask, other=0.0).to(tl.float32)
    if INVERSE:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    tl.store(y_ptr + y_at, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + y_at + HALF, y2.to(y_ptr.dtype.element_ty), mask=mask)
