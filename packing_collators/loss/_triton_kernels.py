"""The Triton kernel of :mod:`packing_collators.loss._triton_rows` (see its picture); imported only where it runs,
since Triton is optional and ``triton.jit`` reads ``TRITON_INTERPRET`` as this module loads."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rows"]


@triton.jit
def _transform(raw, scale, softcap, inv_temperature, SOFTCAP: tl.constexpr):
    """(x, d): the model's logit transform of ``raw`` (float32), and under a soft cap the tanh its derivative needs."""
    u = raw * scale
    if SOFTCAP:
        a = u / softcap
        e = tl.exp(-2.0 * tl.abs(a))  # tanh(a) from exp(-2|a|) <= 1: no overflow
        th = (1.0 - e) / (1.0 + e)
        th = tl.where(a < 0, -th, th)
        return th * softcap * inv_temperature, th
    return u * inv_temperature, u


@triton.jit
def rows(z_ptr, stride, targets_ptr, weights_ptr, lse_ptr, chosen_ptr, loss_ptr, entropy_ptr, mean_ptr, top_ptr,
         square_ptr, scale, softcap, inv_temperature, vocab: tl.constexpr,
         SOFTCAP: tl.constexpr, WANT_GRAD: tl.constexpr, STATS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """One program per row of ``z``: pass 1 its lse, chosen logit, weighted loss (and the statistics), pass 2 the
    gradient over it (``WANT_GRAD``). ``vocab`` a constant: one compile per vocabulary, its loops' bounds known (and
    Triton 3.2's interpreter, the oldest venv's, cannot index with a run-time scalar)."""
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * stride
    target = tl.load(targets_ptr + row)
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -1e30, tl.float32)  # finite: a lane that only sees masked (-inf) columns adds exp(0) * 0
    s = tl.zeros([BLOCK], tl.float32)
    t = tl.zeros([BLOCK], tl.float32)
    q = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_at = tl.zeros([BLOCK], tl.int64)
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        inside = cols < vocab
        raw = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
        x, _ = _transform(raw, scale, softcap, inv_temperature, SOFTCAP)
        x = tl.where(inside, x, float("-inf"))
        m_new = tl.maximum(m, x)
        alpha = tl.exp(m - m_new)
        e = tl.exp(x - m_new)
        s = s * alpha + e
        if STATS:
            kept = tl.where(inside, x, 0.0)  # not e * x at a masked column: 0 * -inf
            t = t * alpha + e * kept
            q = q * alpha * alpha + e * e  # sum e^(2(x-m)): log sum p^2 = log q + 2 m - 2 lse
            total += kept
            better = x > best  # strictly: each lane keeps its first largest column, as argmax does
            best = tl.where(better, x, best)
            best_at = tl.where(better, cols.to(tl.int64), best_at)
        m = m_new
    top = tl.max(m, 0)
    rescale = tl.exp(m - top)
    norm = tl.sum(s * rescale, 0)
    lse = top + tl.log(norm)
    chosen, _ = _transform(tl.load(base + target).to(tl.float32), scale, softcap, inv_temperature, SOFTCAP)
    tl.store(lse_ptr + row, lse)
    tl.store(chosen_ptr + row, chosen)
    weight = tl.load(weights_ptr + row)
    tl.store(loss_ptr + row, weight * (lse - chosen))
    if STATS:
        tl.store(entropy_ptr + row, lse - tl.sum(t * rescale, 0) / norm)  # -sum p log p = lse - E_p[x]
        tl.store(mean_ptr + row, tl.sum(total, 0) / vocab)
        largest = tl.max(best, 0)
        first = tl.min(tl.where(best == largest, best_at, vocab), 0)
        tl.store(top_ptr + row, (first == target).to(tl.float32))
        tl.store(square_ptr + row, tl.log(tl.sum(q * rescale * rescale, 0)) + 2.0 * (top - lse))
    if WANT_GRAD:
        coefficient = weight * scale * inv_temperature
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            inside = cols < vocab
            raw = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
            x, th = _transform(raw, scale, softcap, inv_temperature, SOFTCAP)
            g = (tl.exp(x - lse) - (cols == target).to(tl.float32)) * coefficient
            if SOFTCAP:
                g = g * (1.0 - th * th)
            tl.store(base + cols, g.to(z_ptr.dtype.element_ty), mask=inside)
